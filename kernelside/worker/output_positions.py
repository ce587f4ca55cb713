"""Where a rank's text output has got, so that what it sends on the event channel lands in order.

A rank's text goes through pipes on fds 1/2; its rich output and input prompts go through the
event channel. Before such an event, the rank flushes Python's and C's buffers and writes a *mark*
— a short escape sequence with a number — into fds 1 and 2, and the event carries that number.
The kernel's reader for the rank (``engines.rank_reader``) shows the text up to the mark, then the
event, then what follows. The order is exact, C-level output included: the mark goes down the same
pipe as every byte written before it, whoever wrote them.

What user code prints cannot pass for a mark: each rank process draws a random token when its marks
start to be read, announces it first on the event channel (``marks``, which only nblaunch writes), and
every mark carries it. Text that looks like a mark but lacks the token reaches the cell as text.

Example::

    >>> print("hello"); send_marked(events, "display", {"data": {...}})    # doctest: +SKIP
"""

from __future__ import annotations

import functools
import io
import itertools
import os
import secrets
import sys
import threading

MARK_START = b"\x1b]nblaunch;"  # an OSC sequence: invisible on a terminal, should one ever show it
TOKEN_BYTES = 16  # the token: 32 hex digits


def mark_bytes(token: bytes, n: int) -> bytes:
    """Mark number ``n`` of the rank whose token is ``token`` (``engines.rank_reader`` finds it).

    Example::

        >>> mark_bytes(b"00ff", 3)
        b'\\x1b]nblaunch;00ff;3\\x07'
    """
    return MARK_START + token + b";%d\x07" % n


def std_streams() -> tuple[io.TextIOWrapper, io.TextIOWrapper]:
    """New line-buffered text streams on fds 1 and 2."""
    return tuple(
        io.TextIOWrapper(
            io.FileIO(fd, "w", closefd=False), encoding="utf-8", errors="backslashreplace", line_buffering=True
        )
        for fd in (1, 2)
    )


class _Marks:
    """The numbering of this process's marks. One per process, because fds 1/2 and the event pipe are the
    process's: the lock keeps a mark and its event together when several threads send."""

    def __init__(self):
        self.numbers = itertools.count(1)
        self.lock = threading.Lock()
        self.read = False  # fds 1/2 go to the kernel's ordered reader (else a mark would show as text)
        self.token = b""


_MARKS = _Marks()


def marks_are_read(events) -> None:
    """This rank's fds 1/2 are pipes the kernel's ``RankReader`` reads: ordered events write marks there,
    with this process's token, which goes to the kernel first (before any mark can be written)."""
    _MARKS.token = secrets.token_hex(TOKEN_BYTES).encode()
    events.send("marks", {"token": _MARKS.token.decode()})
    _MARKS.read = True


def send_marked(events, kind: str, payload: dict) -> None:
    """Send ``payload`` as a ``kind`` event placed after everything this rank has written so far.

    Example::

        >>> send_marked(current().events, "input_request", {"id": 1, "prompt": "? "})   # doctest: +SKIP
    """
    if not _MARKS.read:
        events.send(kind, payload)
        return
    with _MARKS.lock:
        n = next(_MARKS.numbers)
        _flush()
        mark = mark_bytes(_MARKS.token, n)
        for fd in (1, 2):
            try:
                os.write(fd, mark)  # a few bytes: one atomic write into the pipe
            except OSError:
                pass  # fd closed by user code: the kernel then shows the event without waiting for the mark
        try:
            events.send(kind, {**payload, "mark": n})
        except BaseException:
            events.send("mark", {"mark": n})  # (it could not be pickled) the text after the mark is not held
            raise


def _flush() -> None:
    for s in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            s.flush()
        except Exception:
            pass
    c = libc()
    if c is not None:
        c.fflush(None)  # printf from C extensions


@functools.cache  # loaded once per process (a parent's handle serves its forked ranks): the C library stays
def libc():
    """The C library already loaded in this process (``ctypes``), or None where it cannot be opened."""
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
