"""How nblaunch's own errors look in a notebook: the message, without the stack of nblaunch's plumbing.

Example::

    >>> class MyError(ShortTraceback, RuntimeError): ...
    >>> MyError("rank 1 failed\nits traceback")._render_traceback_()[1]
    'its traceback'
"""

from __future__ import annotations

import os

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep  # kernelside/, where nblaunch's own frames are


def is_nblaunch_file(filename: str) -> bool:
    """True for a frame of nblaunch's own code (never "the user's line"): the one test every traceback cut,
    stack summary and post-mortem makes.

    Example::

        >>> is_nblaunch_file(PACKAGE_DIR + "worker/lifecycle.py"), is_nblaunch_file("<%%distributed cell In[3]>")
        (True, False)
    """
    return filename.startswith(PACKAGE_DIR)


class ShortTraceback:
    """IPython shows ``_render_traceback_()`` instead of the stack: for these errors the stack
    is nblaunch's own plumbing, and the message already says what, where and what to do."""

    def _render_traceback_(self) -> list[str]:
        red, reset = "\x1b[31m", "\x1b[0m"
        lines = str(self).splitlines() or [""]
        return [f"{red}{type(self).__name__}{reset}: {lines[0]}", *lines[1:]]


def first_line(text: str, limit: int = 300) -> str:
    """The first line of an error's message, cut at ``limit`` characters (what a one-line summary shows).

    Example::

        >>> first_line("ValueError: boom\nTraceback ...")
        'ValueError: boom'
    """
    return (str(text).splitlines() or [""])[0][:limit]


def error_line(error: BaseException) -> str:
    """An exception in one line: its type and its message's ``first_line`` (its type alone without one).

    Example::

        >>> error_line(ValueError("bad batch\nmore")), error_line(KeyboardInterrupt())
        ('ValueError: bad batch', 'KeyboardInterrupt')
    """
    text = first_line(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def summary_line(error: BaseException) -> str:
    """``error_line``, except that nblaunch's own errors are their message without the prefix (it says it all).

    Example::

        >>> summary_line(RuntimeError("nblaunch: rank 1 failed")), summary_line(OSError("no space"))
        ('rank 1 failed', 'OSError: no space')
    """
    first = first_line(str(error).strip())
    return first.removeprefix("nblaunch: ") if first.startswith("nblaunch: ") else error_line(error)
