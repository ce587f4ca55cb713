"""The worker → kernel event channel: one pipe per worker, separate from its stdout.

A message is an 8-byte big-endian length followed by a pickled ``(kind, payload)``
tuple, or, when the length's top bit is set, a raw ``result`` body (already pickled bytes,
so a large return value is not pickled twice and is received into one buffer).
Kinds: ``ready``, ``done``, ``progress``, ``metrics``, ``result``, ``error``, and ``idle`` (a live
rank is back waiting for the next request; see ``worker.live_rank``). ``write_frame`` /
``read_frame`` are the same framing the other way, for a live session's kernel → rank requests.
The writer side lives in the worker (``EventWriter``); the kernel feeds whatever bytes a
non-blocking read returned into an ``EventReader`` and gets whole messages back.

Example::

    >>> r = EventReader()
    >>> list(r.feed(encode("ready", {"t": 1.0})))
    [('ready', {'t': 1.0})]
"""

from __future__ import annotations

import fcntl
import os
import pickle
import struct
import threading

_HEADER = struct.Struct(">Q")
_RAW = 1 << 63
_F_SETPIPE_SZ = 1031  # Linux: a larger pipe buffer means fewer wake-ups for big results


def encode(kind: str, payload) -> bytes:
    body = pickle.dumps((kind, payload), protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(body)) + body


def widen_pipe(fd: int, size: int = 1 << 20) -> None:
    try:
        fcntl.fcntl(fd, _F_SETPIPE_SZ, size)
    except OSError:
        pass  # capped by /proc/sys/fs/pipe-max-size; the default still works


class EventWriter:
    """Worker side. Thread-safe: progress may be reported from several threads."""

    def __init__(self, fd: int):
        self.fd = fd
        self._lock = threading.Lock()

    def send(self, kind: str, payload=None) -> None:
        self._write(encode(kind, payload))

    def send_result(self, body: bytes) -> None:
        """Send already-pickled result bytes as they are."""
        self._write(_HEADER.pack(len(body) | _RAW), body)

    def _write(self, *chunks: bytes) -> None:
        with self._lock:
            for chunk in chunks:
                view = memoryview(chunk)
                while view:
                    view = view[os.write(self.fd, view) :]


class EventReader:
    """Kernel side: reassembles messages from arbitrary chunks.

    The body of a message is collected in a buffer of its announced size, so a large result
    costs one copy on the way in.
    """

    def __init__(self):
        self.mark_token: bytes | None = None  # the rank's mark token (engines.rank_reader), kept with the framing
        self._head = bytearray()
        self._body: bytearray | None = None
        self._filled = 0
        self._raw = False

    def feed(self, chunk: bytes):
        view = memoryview(chunk)
        while view:
            if self._body is None:
                take = _HEADER.size - len(self._head)
                self._head += view[:take]
                view = view[take:]
                if len(self._head) < _HEADER.size:
                    return
                (size,) = _HEADER.unpack(self._head)
                self._head.clear()
                self._raw = bool(size & _RAW)
                self._body = bytearray(size & ~_RAW)
                self._filled = 0
                if not self._body:
                    body, self._body = self._body, None
                    yield ("result", body) if self._raw else pickle.loads(body)
                    continue
            take = min(len(view), len(self._body) - self._filled)
            self._body[self._filled : self._filled + take] = view[:take]
            self._filled += take
            view = view[take:]
            if self._filled == len(self._body):
                body, self._body = self._body, None
                yield ("result", body) if self._raw else pickle.loads(body)


# -- the kernel → rank request channel of a live session (one pipe per rank, only the kernel writes it) --
def frame(body: bytes) -> bytes:
    """One length-prefixed message as bytes (a small one is written in one go: ``World.send_control``)."""
    return _HEADER.pack(len(body)) + body


ONE_WRITE_BYTES = 64 * 1024  # a frame this small goes in one write: one wake-up of the rank's reader, not two


def write_frame(fd: int, body: bytes) -> None:
    """One length-prefixed message (blocking write): the kernel sends a live rank a request."""
    head = _HEADER.pack(len(body))
    chunks = (head + body,) if len(body) <= ONE_WRITE_BYTES else (head, body)  # (a big body is not copied)
    for chunk in chunks:
        view = memoryview(chunk)
        while view:
            view = view[os.write(fd, view) :]


def read_frame(fd: int) -> bytes | None:
    """The next whole message from ``fd`` (blocking), or None when the writer closed the pipe."""
    head = _read_exactly(fd, _HEADER.size)
    if head is None:
        return None
    (size,) = _HEADER.unpack(head)
    return _read_exactly(fd, size & ~_RAW)


def _read_exactly(fd: int, size: int) -> bytes | None:
    buf = bytearray(size)
    view, got = memoryview(buf), 0
    while got < size:
        n = os.readv(fd, [view[got:]])
        if n == 0:
            return None
        got += n
    return bytes(buf) if size < (1 << 20) else buf
