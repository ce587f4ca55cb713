"""Exceptions users handle. Each message says what happened, where, and what to do."""

from __future__ import annotations

from pathlib import Path


class _ShortTraceback:
    """IPython shows ``_render_traceback_()`` instead of the stack: for these errors the stack
    is nblaunch's own plumbing, and the message already says what, where and what to do."""

    def _render_traceback_(self) -> list[str]:
        red, reset = "\x1b[31m", "\x1b[0m"
        lines = str(self).splitlines() or [""]
        return [f"{red}{type(self).__name__}{reset}: {lines[0]}", *lines[1:]]


class LaunchConfigError(_ShortTraceback, ValueError):
    """A launch argument, magic flag or config value is invalid; nothing was started.

    ``key``, ``value`` and ``allowed`` name the offending setting, ``path`` the file it came from.
    """

    def __init__(self, key, value, allowed, *, message: str | None = None, path: Path | None = None):
        self.key, self.value, self.allowed, self.path = key, value, allowed, path
        self._message = message
        super().__init__()

    @property
    def allowed_message(self) -> str:
        if self._message:
            return self._message
        return f"got {self.value!r}; allowed: {self.allowed}"

    def __str__(self):
        if self._message:
            return self._message
        where = f" (in {self.path})" if self.path else ""
        return f"invalid {self.key}={self.value!r}{where}: allowed is {self.allowed}. Nothing was started."


class LaunchError(_ShortTraceback, RuntimeError):
    """The launch could not start (no free port, fork not possible, ...); nothing is left running."""


class WorkerError(_ShortTraceback, RuntimeError):
    """A worker rank failed. ``rank`` is the root cause; ``failures`` lists every failed rank.

    ``report`` is the run report (exit codes, timings, log paths) of the failed run.
    """

    def __init__(self, message: str, *, rank: int | None, failures: list, report=None):
        super().__init__(message)
        self.rank = rank
        self.failures = failures
        self.report = report

    @property
    def remote_traceback(self) -> str | None:
        for f in self.failures:
            if f.rank == self.rank:
                return f.traceback
        return None


class LaunchTimeoutError(WorkerError, TimeoutError):
    """The run took longer than its ``timeout``; every rank was stopped."""


class LaunchStoppedError(WorkerError):
    """The run was stopped from the launch panel (its Stop button or ``POST /nblaunch/runs/<id>/stop``);
    every rank was stopped and nothing is left running. ``rank`` is None: no rank failed."""
