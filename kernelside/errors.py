"""Exceptions users handle. Each message says what happened, where, and what to do.

``WorkerError`` and its two kinds are torch's ``ChildFailedError`` too, so they live in
``run_errors.py`` and are loaded from there on first use (PEP 562): the config schema, which raises
``LaunchConfigError``, is read by the Jupyter server, which must never import torch.

Example::

    >>> from kernelside.errors import LaunchConfigError, WorkerError
    >>> issubclass(WorkerError, RuntimeError)
    True
"""

from __future__ import annotations

import itertools
import reprlib
from pathlib import Path

from .short_traceback import ShortTraceback as _ShortTraceback

_RUN_ERRORS = ("WorkerError", "LaunchTimeoutError", "LaunchStoppedError")


def __getattr__(name: str):
    if name in _RUN_ERRORS:
        from . import run_errors

        return getattr(run_errors, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _ShownValue(reprlib.Repr):
    """repr() for messages: a value is shown whole unless it is longer than any setting, and never by recursing
    into a deeply nested one; mappings keep the order they were written in (reprlib would sort them)."""

    def __init__(self):
        super().__init__()
        self.maxstring = self.maxother = 200
        self.maxlevel, self.maxdict, self.maxlist = 6, 24, 24

    def repr_dict(self, x, level):
        if not x:
            return "{}"
        if level <= 0:
            return "{...}"
        first = itertools.islice(x.items(), self.maxdict)
        items = [f"{self.repr1(k, level - 1)}: {self.repr1(v, level - 1)}" for k, v in first]
        return "{" + ", ".join(items + (["..."] if len(x) > self.maxdict else [])) + "}"


_SHOWN = _ShownValue()


def shown_value(value) -> str:
    """``repr(value)`` for a message: whole for what a setting holds, cut short for a huge or deeply nested value.

    Example::

        >>> shown_value("²"), shown_value([[[[[[[[[[1]]]]]]]]]])
        ("'²'", '[[[[[[[...]]]]]]]')
    """
    return _SHOWN.repr(value)


class LaunchConfigError(_ShortTraceback, ValueError):
    """A launch argument, magic flag or config value is invalid; nothing was started.

    ``key``, ``value`` and ``allowed`` name the offending setting, ``path`` the file it came from, ``source``
    any other place it came from (``the flag --port``, ``notebook_launcher(use_port=...)``); ``line``, for a file
    that cannot be read as a whole, the line where it goes wrong (when known).
    """

    line: int | None = None

    def __init__(
        self, key, value, allowed, *, message: str | None = None, path: Path | None = None, source: str | None = None
    ):
        self.key, self.value, self.allowed, self.path, self.source = key, value, allowed, path, source
        self._message = message
        super().__init__()

    @property
    def allowed_message(self) -> str:
        if self._message:
            return self._message
        return f"got {shown_value(self.value)}; allowed: {self.allowed}"

    def __str__(self):
        if self._message:
            return self._message
        where = f" (in {self.path})" if self.path else f" (from {self.source})" if self.source else ""
        return f"invalid {self.key}={shown_value(self.value)}{where}: allowed is {self.allowed}. Nothing was started."


class LaunchError(_ShortTraceback, RuntimeError):
    """The launch could not start (no free port, fork not possible, ...); nothing is left running."""


class CellInterrupted(_ShortTraceback, KeyboardInterrupt):
    """■ during a run (a one-shot launch or a live session's cell): a KeyboardInterrupt whose message says what
    happened to the ranks (IPython shows it at once, instead of formatting the stack of nblaunch's loop)."""


# What the notebook shows as the error's name: it is a KeyboardInterrupt, and is caught as one.
CellInterrupted.__name__ = CellInterrupted.__qualname__ = "KeyboardInterrupt"
