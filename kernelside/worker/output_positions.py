"""How far a rank's text output has got, so that what it sends on the event channel lands in order.

A rank's text goes through pipes on fds 1/2; its rich output and input prompts go through the
event channel. The kernel reads those pipes in whatever order they become ready, so an event
carries the number of bytes the rank had written to each stream when it was sent: the kernel
shows exactly that much of the text first (``engines.local_bridge``). The counts are kept by the
raw files under ``sys.stdout`` / ``sys.stderr``; bytes that C code writes to fds 1/2 directly are
not counted, so an event after C-level output may land that many bytes early (never late, never lost).

Example::

    >>> out, err = counted_std_streams()      # in a rank, on fds 1 and 2   # doctest: +SKIP
    >>> print("hello"); positions()
    (6, 0)
"""

from __future__ import annotations

import functools
import io
import sys


class CountingFileIO(io.FileIO):
    """A raw file that counts the bytes written through it."""

    written = 0

    def write(self, b) -> int:
        n = super().write(b)
        if n:
            self.written += n
        return n


def _text_stream(fd: int, *, write_through: bool) -> io.TextIOWrapper:
    return io.TextIOWrapper(
        CountingFileIO(fd, "w", closefd=False),
        encoding="utf-8",
        errors="backslashreplace",
        line_buffering=True,
        write_through=write_through,
    )


# The counted streams of this process, kept here rather than read from sys.stdout: code that
# redirects sys.stdout for a while (contextlib.redirect_stdout) must not lose the count.
_COUNTED: dict[str, io.TextIOWrapper] = {}


def counted_std_streams() -> tuple[io.TextIOWrapper, io.TextIOWrapper]:
    """New line-buffered text streams on fds 1 and 2 whose bytes are counted."""
    out, err = _text_stream(1, write_through=False), _text_stream(2, write_through=False)
    _COUNTED.update(stdout=out, stderr=err)
    return out, err


def ensure_counted() -> None:
    """Make sys.stdout / sys.stderr counted streams if they are not yet (a spawned rank's own)."""
    if _COUNTED:
        return
    for s in (sys.stdout, sys.stderr):
        try:
            s.flush()
        except Exception:
            pass
    sys.stdout, sys.stderr = counted_std_streams()
    sys.__stdout__, sys.__stderr__ = sys.stdout, sys.stderr


def positions() -> dict[str, int]:
    """Flush Python's and C's buffers, then how many bytes each stream has written so far.

    Example::

        >>> positions()         # doctest: +SKIP
        {'stdout': 120, 'stderr': 0}
    """
    for s in (sys.stdout, sys.stderr, *_COUNTED.values()):
        try:
            s.flush()
        except Exception:
            pass
    libc = _libc()
    if libc is not None:
        libc.fflush(None)  # printf from C extensions
    return {name: s.buffer.written for name, s in _COUNTED.items()} or {"stdout": 0, "stderr": 0}


@functools.cache  # loaded once per process: the C library does not change
def _libc():
    import ctypes

    try:
        return ctypes.CDLL(None)
    except OSError:
        return None
