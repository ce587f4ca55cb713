"""Kernel side of rank 0's prompts: ask the notebook's frontend, without stopping the kernel loop.

The question is asked with the kernel's own ``input()`` / ``getpass()`` as the launching cell sees
them (ipykernel forwards those to the frontend's stdin channel when the request allowed stdin, and
raises ``StdinNotImplementedError`` when it did not), in a thread: the kernel loop keeps routing
output and watching the ranks while the user types, so another rank's failure still stops the
launch at once. The answer wakes the loop through a pipe and goes to the rank on its replies pipe.

One question is open at a time: a rank that asks while another's prompt is open (two ranks stopping
in their debuggers at once) waits its turn, and its debugger's text (``text``: what a rank other than
0 printed in its debugger) is shown in the cell just before its own prompt.

A question still open when the launch ends is withdrawn: its thread gets a ``KeyboardInterrupt``
(ipykernel's wait for the reply ends on it, as on ■), so no stale reader is left on the kernel's
stdin channel to take the answer meant for a later ``input()``.

Example::

    >>> relay = StdinRelay()                                        # doctest: +SKIP
    >>> relay.ask(rank0_replies_fd, {"id": 1, "prompt": "name? ", "password": False})
    >>> ...  # the loop calls relay.on_wake() when relay.wake_fd is readable
    >>> relay.close()
"""

from __future__ import annotations

import builtins
import collections
import contextvars
import ctypes
import getpass
import os
import queue
import threading

from ..channel import encode
from ..debugger.undebugged import undebugged

WITHDRAW_WAIT_S = 1.0


class StdinRelay:
    """Asks the frontend for one line at a time, in a thread; answers are delivered by the kernel loop."""

    def __init__(self, show_text=None, on_wake_fd=None):
        """``show_text(text)``: writes a rank's debugger text into the cell (before its prompt);
        ``on_wake_fd(fd)``: called with ``wake_fd`` when the first question makes it (the loop watches it from
        then on). A launch whose ranks never ask costs no pipe: most cells ask nothing."""
        self._show_text = show_text
        self._on_wake_fd = on_wake_fd
        self._turns: collections.deque = collections.deque()  # (reply_fd, request) waiting for their turn
        self._busy = False
        # the kernel's forwarding functions, as the launching cell sees them (ipykernel swaps them per request)
        self._ask_line = builtins.input
        self._ask_secret = getpass.getpass
        self.wake_fd = self._wake_w = -1  # made by the first question (``_next``)
        self._answers: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()  # guards _wake_w against close() (an fd number can be reused)
        self._closed = False
        self._thread: threading.Thread | None = None
        self.asked = 0

    @property
    def waiting(self) -> bool:
        return (self._thread is not None and self._thread.is_alive()) or bool(self._turns)

    def ask(self, reply_fd: int, request: dict) -> None:
        """Start asking the frontend (or queue the question behind the open one); the answer (or the error
        the kernel's input() raised) comes back later."""
        self._turns.append((reply_fd, request, contextvars.copy_context()))
        self._next()

    def _next(self) -> None:
        if self._busy or not self._turns:
            return
        if self.wake_fd < 0:
            self.wake_fd, self._wake_w = os.pipe()
            os.set_blocking(self.wake_fd, False)
            if self._on_wake_fd is not None:
                self._on_wake_fd(self.wake_fd)
        reply_fd, request, ctx = self._turns.popleft()
        self._busy = True
        self.asked += 1
        # ctx: the cell's request context, taken when the rank asked: the frontend that ran it gets the prompt
        self._thread = undebugged(
            threading.Thread(target=ctx.run, args=(self._ask, reply_fd, request), name="nblaunch-stdin", daemon=True)
        )
        self._thread.start()

    def _ask(self, reply_fd: int, request: dict) -> None:
        reply = {"id": request.get("id")}
        try:
            if request.get("text") and self._show_text is not None:
                self._show_text(str(request["text"]))
            fn = self._ask_secret if request.get("password") else self._ask_line
            reply["value"] = str(fn(request.get("prompt", "")))
        except BaseException as e:  # noqa: B036 - whatever the kernel's input() raised, the rank raises
            reply["error"] = {"type": type(e).__name__, "message": str(e)}
        try:
            self._answers.put((reply_fd, reply))
            with self._lock:
                self._busy = False  # before the wake: on_wake() then starts the next question
                if not self._closed:
                    try:
                        os.write(self._wake_w, b"!")
                    except OSError:
                        pass
        except KeyboardInterrupt:
            pass  # a withdrawal (close()) that came as the answer was being handed over: the launch is over anyway

    def on_wake(self) -> None:
        """(kernel loop) Hand every answer that arrived to its rank."""
        try:
            while os.read(self.wake_fd, 4096):
                pass
        except (BlockingIOError, OSError):
            pass
        while True:
            try:
                reply_fd, reply = self._answers.get_nowait()
            except queue.Empty:
                return
            _send(reply_fd, encode("input_reply", reply))
            self._next()

    def close(self) -> None:
        """Withdraw an open question (and those waiting their turn) and release the wake pipe."""
        self._turns.clear()
        thread = self._thread
        if thread is not None and thread.is_alive():
            with self._lock:
                open_question = self._busy  # (an answered question's thread is only finishing: not interrupted)
            if open_question:
                _raise_in_thread(thread, KeyboardInterrupt)
            thread.join(WITHDRAW_WAIT_S)
        with self._lock:
            self._closed = True
            for fd in (self.wake_fd, self._wake_w):
                if fd >= 0:
                    try:
                        os.close(fd)
                    except OSError:
                        pass


def _send(fd: int, data: bytes) -> None:
    view = memoryview(data)
    try:
        while view:
            try:
                view = view[os.write(fd, view) :]
            except BlockingIOError:
                os.set_blocking(fd, True)  # a reply is small; a full pipe means the rank is about to read it
    except OSError:
        pass  # the rank is gone; its exit is handled by the loop


def _raise_in_thread(thread: threading.Thread, exc_type: type[BaseException]) -> None:
    """Raise ``exc_type`` in ``thread`` at its next Python instruction (ipykernel polls the stdin
    socket every 10 ms in Python, so this lands promptly)."""
    if thread.ident is not None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(exc_type))
