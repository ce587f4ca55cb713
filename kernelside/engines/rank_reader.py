"""One ordered reader per local rank: it owns the rank's stdout, stderr and event pipes and their order.

A rank sends an event that must land in order with its text (rich output, an input prompt) after
writing a *mark* into fds 1 and 2 (``worker.output_positions.send_marked``), so every byte written
before the event — by Python or by C code — is in the pipes ahead of the mark. The reader gives
what it read back as one ordered list of items:

- text up to a mark goes out at once; text after a mark whose event has not arrived yet waits;
- an event with a mark first takes the text before that mark out of the pipes (it is there: the
  mark was written before the event was sent), then goes out, then releases what waited;
- an event without a mark (progress, metrics…) goes out as it comes.

Nothing waits on the rank: a mark that never reaches the pipe (fd 1 closed by user code) is not
waited for, and at the end whatever is held goes out (marks stripped). A mark carries the rank's token,
which the rank sends as its first event (``marks``) before it writes any mark: text that looks like a
mark without it (printed by user code, with any number of digits) is passed on as text, and a mark
seen before the token's event was read makes the reader read the event pipe first. The kernel loop only
multiplexes: it hands each readable pipe to its rank's reader and routes the items.

Example::

    >>> reader = RankReader(worker, selector, EventReader())   # registers the three pipes   # doctest: +SKIP
    >>> for item in reader.on_readable("stdout"):
    ...     print(item)                  # ("output", "stdout", b"...") or ("event", "display", {...})
"""

from __future__ import annotations

import os
import re
import selectors

from ..channel import EventReader
from ..worker.output_positions import MARK_START, TOKEN_BYTES

STREAMS = ("stdout", "stderr")
MAX_MARK_DIGITS = 18  # a rank numbers its marks from 1: never more digits than this
_TOKEN = re.compile(rb"[0-9a-f]{%d}" % (2 * TOKEN_BYTES))


def _complete_end(buf: bytearray, start: bytes) -> int:
    """How much of ``buf`` can go out: all but a trailing start of a mark ``start`` + digits (its rest is
    still in the pipe)."""
    i = buf.rfind(b"\x1b", max(0, len(buf) - len(start) - MAX_MARK_DIGITS - 1))
    if i < 0:
        return len(buf)
    tail = bytes(buf[i:])
    head, digits = tail[: len(start)], tail[len(start) :]
    if start.startswith(head) and (not digits or digits.isdigit()):
        return i
    return len(buf)


class _Marks:
    """A rank's marks in its text: ``start`` (with the rank's token), 1 to ``MAX_MARK_DIGITS`` digits, BEL. Found
    by a byte search: a pattern per token would be compiled anew for every rank of every launch (0.6 ms each)."""

    def __init__(self, start: bytes):
        self.start = start

    def search(self, buf, pos: int = 0) -> tuple[int, int, int] | None:
        """The first mark in ``buf`` from ``pos``: (where it starts, where it ends, its number), or None."""
        while (i := buf.find(self.start, pos)) >= 0:
            first = end = i + len(self.start)
            while end < len(buf) and end - first < MAX_MARK_DIGITS and 48 <= buf[end] <= 57:  # ASCII digits
                end += 1
            if end > first and end < len(buf) and buf[end] == 7:
                return i, end + 1, int(buf[first:end])
            pos = i + 1
        return None

    def strip(self, buf) -> bytes:
        """``buf`` without its marks."""
        parts, pos = [], 0
        while (m := self.search(buf, pos)) is not None:
            parts.append(bytes(buf[pos : m[0]]))
            pos = m[1]
        parts.append(bytes(buf[pos:]))
        return b"".join(parts)


class RankReader:
    """The ordered reader of one rank's three pipes (see the module docstring)."""

    def __init__(self, worker, sel: selectors.BaseSelector, events: EventReader):
        """``events``: the rank's event framing, kept across runs when its process is (a live session)."""
        self.w, self.sel, self.events = worker, sel, events
        p = worker.pipes
        self.fds = {"stdout": p.stdout_r, "stderr": p.stderr_r, "events": p.events_r}
        for kind, fd in self.fds.items():
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_READ, (self, kind))
        self.held = {s: bytearray() for s in STREAMS}  # read, not yet given out
        self.blocked: dict[str, int | None] = dict.fromkeys(STREAMS)  # a mark read whose event has not come
        self.released = 0  # the highest mark whose event has gone out
        self.items: list[tuple] = []
        self.mark = None  # the rank's marks (``_Marks`` with its token), once its ``marks`` event is read
        self.mark_start = MARK_START
        if events.mark_token is not None:  # (a live rank's token came in an earlier run)
            self._learn(events.mark_token)

    # -- what the loop calls ----------------------------------------------------------------
    def on_readable(self, kind: str) -> list[tuple]:
        """Read one chunk of the ready pipe; the items that can go out now, in order."""
        data = self._read(kind)
        if data is not None:
            self._consume(kind, data)
        return self._take()

    def drain(self, final: bool = False, ready: set[int] | None = None) -> list[tuple]:
        """Everything in the pipes now (events first: each takes its text along); ``final``: the rank has
        ended or the run is over, so what still waits for an event goes out too (marks stripped). ``ready``:
        the fds a zero-wait select found readable just before (the others are not read: nothing is there)."""
        for kind in ("events", *STREAMS):
            if ready is not None and self.fds[kind] not in ready:
                continue
            while (data := self._read(kind)) is not None:
                self._consume(kind, data)
        if final:
            for s in STREAMS:
                self.blocked[s] = None
                held = bytes(self.held[s])
                self._emit(s, self.mark.strip(held) if self.mark is not None else held)
                self.held[s].clear()
        return self._take()

    # -- inside -----------------------------------------------------------------------------
    def _consume(self, kind: str, data: bytes) -> None:
        if kind == "events":
            for ev_kind, payload in self.events.feed(data):
                self._event(ev_kind, payload)
        else:
            self.held[kind] += data
            self._advance(kind)

    def _read(self, kind: str) -> bytes | None:
        """One read: bytes, or None when nothing is there now (EOF: the pipe is unregistered)."""
        fd = self.fds[kind]
        if fd not in self.sel.get_map():
            return None
        try:
            data = os.read(fd, 1 << 20)
        except BlockingIOError:
            return None
        except OSError:
            data = b""
        if not data:
            self.sel.unregister(fd)
            return None
        return data

    def _learn(self, token: bytes) -> None:
        self.events.mark_token = token
        self.mark_start = MARK_START + token + b";"
        self.mark = _Marks(self.mark_start)

    def _event(self, kind: str, payload) -> None:
        if kind == "marks":  # the rank's token: sent before its first mark, never shown
            token = payload.get("token") if isinstance(payload, dict) else None
            if isinstance(token, str) and _TOKEN.fullmatch(token.encode()) and self.mark is None:
                self._learn(token.encode())
            return
        mark = payload.get("mark") if isinstance(payload, dict) else None
        if mark is None:
            self.items.append(("event", kind, payload))
            return
        for s in STREAMS:
            self._catch_up(s, mark)
        if kind != "mark":  # (a bare mark: the rank's event could not be sent; only the text moves on)
            self.items.append(("event", kind, payload))
        self.released = max(self.released, mark)
        for s in STREAMS:
            if self.blocked[s] is not None and self.blocked[s] <= self.released:
                self.blocked[s] = None
            self._advance(s)

    def _catch_up(self, stream: str, mark: int) -> None:
        """Give out the text ``stream`` had before ``mark``: from what was read, then from the pipe."""
        while True:
            at = self.blocked[stream]
            if at is not None:
                if at >= mark:
                    return  # reached (the event releases it)
                self.blocked[stream] = None  # a mark whose event never came (it could not be sent): behind us
                self._advance(stream)
                continue
            data = self._read(stream)
            if data is None:
                return  # the mark is not in this pipe (user code closed or moved fd 1/2): nothing to wait for
            self.held[stream] += data
            self._advance(stream)

    def _advance(self, stream: str) -> None:
        """Give out the held text of ``stream`` up to its next mark whose event has not gone out."""
        buf = self.held[stream]
        if self.mark is None and (i := buf.find(MARK_START)) >= 0:
            # a mark, or text that looks like one: what is before it goes out, and the token (sent before
            # any mark) is in the event pipe
            self._emit(stream, bytes(buf[:i]))
            del buf[:i]
            while self.mark is None and (data := self._read("events")) is not None:
                self._consume("events", data)
        while self.blocked[stream] is None:
            m = self.mark.search(buf) if self.mark is not None else None
            if m is None:
                end = _complete_end(buf, self.mark_start)
                self._emit(stream, bytes(buf[:end]))
                del buf[:end]
                return
            start, end, n = m
            self._emit(stream, bytes(buf[:start]))
            del buf[:end]
            if n > self.released:
                self.blocked[stream] = n

    def _emit(self, stream: str, data: bytes) -> None:
        if data:
            self.items.append(("output", stream, data))

    def _take(self) -> list[tuple]:
        items, self.items = self.items, []
        return items
