"""One Debug Adapter Protocol connection, the kernel at one end and a rank's debugger (pydevd) at the other.

DAP messages are JSON bodies after a ``Content-Length: N`` header and a blank line. A reader thread (never
traced by the kernel's own debugger) takes every message off the socket: responses wake the request that
waits for them, events go to ``on_event`` (called in the reader thread). A closed socket answers every
waiting request with a failure at once: a rank that ends never leaves the kernel waiting on it.

Example::

    conn = DapConnection(sock, on_event=print)
    conn.request("threads")["body"]["threads"]     # [{'id': 1, 'name': 'MainThread'}]
"""

from __future__ import annotations

import json
import socket
import threading

from .undebugged import undebugged

HEADER = b"Content-Length: "
MAX_MESSAGE = 64 << 20  # a variables answer can be large; a length beyond this is not a debugger talking


class DapClosed(ConnectionError):
    """The other end is gone (the rank ended, or the connection was closed)."""


class DapConnection:
    def __init__(self, sock: socket.socket, on_event=None, name: str = "rank"):
        self.sock, self.on_event, self.name = sock, on_event, name
        self.seq = 0
        self.lock = threading.Lock()
        self.waiting: dict[int, list] = {}  # seq → [threading.Event, response]
        self.closed = False
        self.reader = undebugged(threading.Thread(target=self._read, name=f"nblaunch-dap-{name}", daemon=True))
        self.reader.start()

    def send(self, command: str, arguments: dict | None = None, keep: bool = True) -> threading.Event:
        """Send a request; the Event is set when its response (``answer(event)``) has come. ``keep=False``:
        nobody waits for this one (its response is dropped when it comes)."""
        with self.lock:
            if self.closed:
                raise DapClosed(f"the debugger connection to {self.name} is closed")
            self.seq += 1
            seq = self.seq
            done = threading.Event()
            done.seq = seq
            if keep:
                self.waiting[seq] = [done, None]
            body = json.dumps(
                {"type": "request", "seq": seq, "command": command, "arguments": arguments or {}}
            ).encode()
            try:
                self.sock.sendall(HEADER + str(len(body)).encode() + b"\r\n\r\n" + body)
            except OSError as e:
                self.waiting.pop(seq, None)
                if not keep:
                    return done
                raise DapClosed(f"the debugger connection to {self.name} is closed: {e}") from None
        return done

    def answer(self, done: threading.Event, timeout: float) -> dict:
        """The response ``done`` waited for (see ``send``)."""
        if not done.wait(timeout):
            with self.lock:
                self.waiting.pop(done.seq, None)
            raise TimeoutError(f"{self.name}'s debugger did not answer in {timeout:.0f}s")
        with self.lock:
            _, response = self.waiting.pop(done.seq)
        if response is None:
            raise DapClosed(f"{self.name} ended while its debugger was asked something")
        return response

    def request(self, command: str, arguments: dict | None = None, timeout: float = 30) -> dict:
        """Send one request and return its response (a dict with ``success``, ``body``...)."""
        return self.answer(self.send(command, arguments), timeout)

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()

    def _read(self) -> None:
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    chunk = self.sock.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                head, buf = buf.split(b"\r\n\r\n", 1)
                length = _content_length(head)
                while len(buf) < length:
                    chunk = self.sock.recv(max(65536, length - len(buf)))
                    if not chunk:
                        return
                    buf += chunk
                body, buf = buf[:length], buf[length:]
                self._dispatch(json.loads(body))
        except (OSError, ValueError):
            return
        finally:
            with self.lock:
                self.closed = True
                for entry in self.waiting.values():
                    entry[0].set()  # (response None: the connection is gone)
            if self.on_event is not None:
                self.on_event({"type": "event", "event": "nblaunch:closed", "body": {}})

    def _dispatch(self, msg: dict) -> None:
        if msg.get("type") == "response":
            with self.lock:
                entry = self.waiting.get(msg.get("request_seq"))
                if entry is not None:
                    entry[1] = msg
                    entry[0].set()
        elif msg.get("type") == "event" and self.on_event is not None:
            self.on_event(msg)


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n"):
        if line.startswith(HEADER):
            n = int(line[len(HEADER) :])
            if 0 <= n <= MAX_MESSAGE:
                return n
    raise ValueError(f"not a DAP header: {head[:80]!r}")
