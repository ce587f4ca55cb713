"""The worker → kernel event channel: one pipe per worker, separate from its stdout.

A message is an 8-byte big-endian length followed by a pickled ``(kind, payload)``
tuple. Kinds: ``ready``, ``progress``, ``metrics``, ``result``, ``error``. The writer
side lives in the worker (``EventWriter``); the kernel feeds whatever bytes a
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
        self.send_raw(encode(kind, payload))

    def send_raw(self, data: bytes) -> None:
        view = memoryview(data)
        with self._lock:
            while view:
                n = os.write(self.fd, view)
                view = view[n:]


class EventReader:
    """Kernel side: reassembles messages from arbitrary chunks."""

    def __init__(self):
        self._buf = bytearray()
        self._need: int | None = None

    def feed(self, chunk: bytes):
        self._buf += chunk
        while True:
            if self._need is None:
                if len(self._buf) < _HEADER.size:
                    return
                (self._need,) = _HEADER.unpack_from(self._buf)
                del self._buf[: _HEADER.size]
            if len(self._buf) < self._need:
                return
            body = bytes(self._buf[: self._need])
            del self._buf[: self._need]
            self._need = None
            yield pickle.loads(body)

    @property
    def pending_bytes(self) -> int:
        return len(self._buf)
