"""The run's control channel: an AF_UNIX socket ``control.sock`` in its owner-only run folder.

The kernel that runs the launch listens on it, from its own event loop (the socket sits in
the loop's selector beside the ranks' pipes): the launch panel's server extension connects,
sends one JSON line ``{"op": "stop"}`` and reads one JSON line back. Stop is therefore
carried out by the process that owns the ranks, through its usual failure path; nothing
else ever signals a rank on the panel's behalf. ``{"op": "stacks"}`` is answered with every
rank's current Python stack (``rank_stacks``): the ranks are signalled from the loop's thread
(which holds their zombies: no reused pid), and a short-lived thread waits for their dumps and
sends the answer, so the loop never waits for a rank.

Only this user can reach the socket (the run folder is 0700) and a peer of another uid is
refused anyway (``SO_PEERCRED``). Requests are tiny and never block the loop: every socket
is non-blocking, a request over ``MAX_REQUEST_BYTES`` or a peer that sends nothing is dropped.

Example::

    >>> control = RunControl.listen(run_dir)                       # doctest: +SKIP
    >>> control.register(selector, on_stop=lambda place: True)          # doctest: +SKIP
    >>> # in the loop: key.data == (control, "control") -> control.on_ready(key.fd)
    >>> control.close()
"""

from __future__ import annotations

import json
import os
import selectors
import socket
import struct
import threading

from ..debugger.undebugged import undebugged
from ..private_dir import folder_fd
from ..run_contract import CONTROL_SOCKET, stopped_message  # the run folder's contract (the server connects by it)
from . import rank_stacks

STOPPED_MESSAGE = stopped_message()
MAX_REQUEST_BYTES = 4096
MAX_PENDING = 8  # connections that have not sent their request yet; beyond this the oldest is dropped


def socket_address(run_dir: str, dir_fd: int | None = None) -> str:
    """The address to bind or connect: ``/proc/self/fd/<dir_fd>/control.sock`` (the open run folder itself,
    whatever its path names now, and never too long for ``sun_path``), or the path without a descriptor."""
    if dir_fd is None:
        return os.path.join(run_dir, CONTROL_SOCKET)
    return f"/proc/self/fd/{dir_fd}/{CONTROL_SOCKET}"


class RunControl:
    """Listens on ``<run_dir>/control.sock`` and answers ``stop`` (and ``ping``) requests."""

    # what a Stop is answered with; a live session's channel says it stops the session (live/run_entry.py)
    stopping_message = "stopping: every rank gets SIGTERM now, SIGKILL after a short grace"

    def __init__(self, run_dir: str, listener: socket.socket):
        self.run_dir = run_dir
        self.path = os.path.join(run_dir, CONTROL_SOCKET)
        self.listener = listener
        self.sel: selectors.BaseSelector | None = None
        self.on_stop = None
        self.on_stacks = None
        self.answering: list[threading.Thread] = []  # stacks answers being collected
        self.pending: dict[int, tuple[socket.socket, bytearray]] = {}

    @classmethod
    def listen(cls, run_dir: str) -> RunControl:
        """Create and bind the socket in ``run_dir`` (which must exist and be this user's)."""
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with folder_fd(run_dir) as dir_fd:  # the launch's open run folder (an OpenFolder), not its path
                listener.bind(socket_address(run_dir, dir_fd))
            listener.listen(MAX_PENDING)
            listener.setblocking(False)
        except BaseException:
            listener.close()
            raise
        return cls(run_dir, listener)

    def register(self, sel: selectors.BaseSelector, on_stop, on_stacks=None) -> None:
        """Serve requests from ``sel``'s loop; ``on_stop(place)`` returns True (or the reply's text) if it began
        stopping the run (``place``: where Stop was pressed, ``run_contract.STOP_PLACES``, or None);
        ``on_stacks()`` returns the ranks to ask for stacks, [(rank, pid, how it ended or None)]."""
        self.sel, self.on_stop, self.on_stacks = sel, on_stop, on_stacks
        sel.register(self.listener, selectors.EVENT_READ, (self, "control"))

    def on_ready(self, fd: int) -> None:
        """Called by the loop when one of this channel's sockets is readable."""
        if fd == self.listener.fileno():
            self._accept()
        else:
            self._receive(fd)

    def _accept(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _pid, uid, _gid = struct.unpack("3i", creds)
        if uid != os.getuid():
            conn.close()
            return
        conn.setblocking(False)
        if len(self.pending) >= MAX_PENDING:
            self._drop(next(iter(self.pending)))
        self.pending[conn.fileno()] = (conn, bytearray())
        self.sel.register(conn, selectors.EVENT_READ, (self, "control"))

    def _receive(self, fd: int) -> None:
        conn, buf = self.pending[fd]
        try:
            data = conn.recv(MAX_REQUEST_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        buf += data
        if b"\n" not in buf and data and len(buf) <= MAX_REQUEST_BYTES:
            return  # the rest of the line is still coming
        if self._is_stacks(buf):
            self._answer_stacks(fd)
            return
        reply = self._answer(bytes(buf).split(b"\n", 1)[0]) if buf else None
        if reply is not None:
            try:
                conn.send(json.dumps(reply).encode() + b"\n")  # a few bytes: fits the socket buffer at once
            except OSError:
                pass
        self._drop(fd)

    def _answer(self, line: bytes) -> dict:
        try:
            request = json.loads(line)
            op = request.get("op") if isinstance(request, dict) else None
        except (ValueError, UnicodeDecodeError):
            return {"ok": False, "message": "the request is not a JSON object"}
        if op == "ping":
            return {"ok": True, "message": "the run is live"}
        if op == "stop":
            place = request.get("from")
            began = self.on_stop(place if isinstance(place, str) else None)
            if began:  # (a live session says what it stops: the running cell, or the session)
                return {"ok": True, "message": began if isinstance(began, str) else self.stopping_message}
            return {"ok": True, "message": "the run is already stopping"}
        return {"ok": False, "message": f"unknown op {op!r}: allowed are 'stop', 'stacks' and 'ping'"}

    def _is_stacks(self, buf: bytearray) -> bool:
        try:
            request = json.loads(bytes(buf).split(b"\n", 1)[0])
        except (ValueError, UnicodeDecodeError):
            return False
        return isinstance(request, dict) and request.get("op") == "stacks"

    def _answer_stacks(self, fd: int) -> None:
        conn, _ = self.pending.pop(fd)
        try:
            self.sel.unregister(conn)
        except (KeyError, ValueError):
            pass
        if self.on_stacks is None:
            _send_and_close(conn, {"ok": False, "message": "this run cannot show its ranks' stacks"})
            return
        try:
            request = rank_stacks.StackRequest.send(self.run_dir, self.on_stacks())
        except Exception as e:  # noqa: BLE001 - the run goes on; the asker gets the reason
            _send_and_close(conn, {"ok": False, "message": f"the ranks could not be asked: {type(e).__name__}: {e}"})
            return
        t = undebugged(
            threading.Thread(target=_collect_and_reply, args=(conn, request), name="nblaunch-stacks", daemon=True)
        )
        self.answering = [a for a in self.answering if a.is_alive()] + [t]
        t.start()

    def _drop(self, fd: int) -> None:
        conn, _ = self.pending.pop(fd)
        try:
            self.sel.unregister(conn)
        except (KeyError, ValueError):
            pass
        conn.close()

    def close(self) -> None:
        """Stop listening and remove the socket file: a later connect finds no owner."""
        for t in self.answering:
            t.join(rank_stacks.ANSWER_TIMEOUT_S + 1.5)  # bounded: collect() and a 1 s send
        for fd in list(self.pending):
            conn, _ = self.pending.pop(fd)
            conn.close()
        self.listener.close()  # the loop's selector is closed by then (or never had it)
        try:
            with folder_fd(self.run_dir) as dir_fd:
                os.unlink(CONTROL_SOCKET, dir_fd=dir_fd)
        except OSError:
            pass


def _collect_and_reply(conn: socket.socket, request) -> None:
    try:
        answer = request.collect(label=rank_stacks.kernel_label)
        _send_and_close(conn, {"ok": True, **answer})
    except Exception as e:  # noqa: BLE001 - the asker gets the reason rather than silence
        _send_and_close(conn, {"ok": False, "message": f"the stacks could not be read: {type(e).__name__}: {e}"})


def _send_and_close(conn: socket.socket, reply: dict) -> None:
    try:
        conn.setblocking(True)
        conn.settimeout(1.0)  # a client that stopped reading never holds the thread
        conn.sendall(json.dumps(reply).encode() + b"\n")
    except OSError:
        pass
    finally:
        conn.close()
