"""A rank's ``input()``, ``getpass()``, ``sys.stdin`` and debugger prompts, answered in the notebook.

A forked rank inherits the kernel's ``input`` (which talks to the frontend over the kernel's own
socket, so the prompt never shows and the rank hangs) and the kernel's ``breakpoint()`` hook
(debugpy's). In a rank they are replaced: a prompt becomes an ``input_request`` event; the kernel
asks the frontend through its stdin channel, as ``input()`` in a notebook cell does
(``stdin_relay.py``), and writes the answer back on the rank's replies pipe. pdb reads its
commands through ``input()``, so ``pdb.set_trace()`` and ``breakpoint()`` work on every rank as they
do in a cell (``rank_debugger.py``: the prompt names the rank): ``n``, ``s``, ``p x``, ``c``; ``q``
stops the launch. Where the frontend cannot answer (nbclient, papermill: ``allow_stdin`` is false)
the rank raises ``StdinNotImplementedError``, as the kernel would.

Only rank 0 reads plain ``input()`` from the notebook (one answer box per cell, and N ranks asking for
data at once would be answered in an order nobody chose): other ranks' ``input()`` and ``getpass()``
raise ``RankInputError`` naming the rank; their debugger prompts are served one at a time.

Example (in a ``%%distributed`` cell)::

    name = input("name? ") if rank == 0 else None      # the prompt appears under the cell
    if rank == 1:
        breakpoint()                                    # "(rank 1) (Pdb)" under the cell
"""

from __future__ import annotations

import builtins
import getpass
import io
import itertools
import os
import sys
import threading

from ..channel import EventReader
from . import output_positions, rank_debugger

STDIN_RANK = 0  # the rank whose prompts the notebook answers


class RankInputError(RuntimeError):
    """A rank other than rank 0 tried to read ``input()`` from the notebook, or a rank without a channel to it."""


class _Asker:
    """Sends prompts as events and blocks until the kernel writes the answer on the replies pipe."""

    def __init__(self, events, replies_fd: int):
        self.events, self.fd = events, replies_fd
        self.reader = EventReader()
        self.ids = itertools.count(1)
        self.lock = threading.Lock()  # one prompt at a time, as on a terminal

    def ask(self, prompt: str, password: bool, text: str = "") -> str:
        """``text``: what to show in the cell before the prompt (a debugger's output on a rank other than 0)."""
        with self.lock:
            rid = next(self.ids)
            request = {"id": rid, "prompt": prompt, "password": password}
            if text:
                request["text"] = text
            output_positions.send_marked(self.events, "input_request", request)  # after everything printed so far
            reply = self._wait(rid)
        if "error" in reply:
            raise _rebuild(reply["error"])
        return reply["value"]

    def _wait(self, rid: int) -> dict:
        while True:
            data = os.read(self.fd, 1 << 16)
            if not data:
                raise EOFError("the notebook closed rank 0's input channel (the launch is ending)")
            for kind, payload in self.reader.feed(data):
                if kind == "input_reply" and payload.get("id") == rid:
                    return payload


def _rebuild(err: dict) -> BaseException:
    """The exception the kernel's own input() raised, raised again here."""
    kind, message = err.get("type"), err.get("message", "")
    if kind == "StdinNotImplementedError":
        from IPython.core.error import StdinNotImplementedError

        return StdinNotImplementedError(message)
    if kind == "EOFError":
        return EOFError(message)
    if kind == "KeyboardInterrupt":
        return KeyboardInterrupt(message)
    return RuntimeError(f"the notebook could not answer rank 0's prompt: {kind}: {message}")


class NotebookStdin(io.TextIOBase):
    """Rank 0's ``sys.stdin``: each line read is asked for in the notebook."""

    def __init__(self, asker: _Asker):
        super().__init__()
        self._asker = asker

    @property
    def encoding(self):
        return "utf-8"

    @property
    def name(self):
        return "<notebook stdin>"

    def readable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def readline(self, size=-1) -> str:
        try:
            return self._asker.ask("", False) + "\n"
        except EOFError:
            return ""

    def read(self, size=-1) -> str:
        return self.readline()


def install(events, replies_fd: int, rank: int) -> None:
    """Answer this rank's prompts in the notebook (rank 0; every rank's debugger), or refuse them clearly.

    Example::

        >>> install(current().events, payload.replies_fd, rank=0)   # doctest: +SKIP
    """
    if replies_fd < 0:  # an engine without a channel to the notebook
        rank_debugger.install(rank, None)
        builtins.input = _refusing_input(rank)
        getpass.getpass = _refusing_getpass(rank)
        sys.breakpointhook = _refusing_breakpoint(rank)
        return
    asker = _Asker(events, replies_fd)
    # The kernel's hook is debugpy's, which would wait for a debugger client: plain pdb instead,
    # which reads its commands through input() below (PYTHONBREAKPOINT is honoured).
    sys.breakpointhook = sys.__breakpointhook__
    if rank != STDIN_RANK:
        text = rank_debugger.DebuggerText()
        rank_debugger.install(rank, text)
        refuse = _refusing_input(rank)

        def debugger_only_input(prompt=""):
            if _is_debugger_prompt(str(prompt)):
                return asker.ask(str(prompt), False, text.take())
            return refuse(prompt)

        builtins.input = debugger_only_input
        getpass.getpass = _refusing_getpass(rank)
        return
    rank_debugger.install(rank, None)

    def notebook_input(prompt=""):
        return asker.ask(str(prompt), False)

    def notebook_getpass(prompt="Password: ", stream=None):
        return asker.ask(str(prompt), True)

    builtins.input = notebook_input
    getpass.getpass = notebook_getpass
    sys.stdin = NotebookStdin(asker)


def _is_debugger_prompt(prompt: str) -> bool:
    return prompt.startswith("(Pdb)") or (prompt.startswith("(rank ") and ") (Pdb)" in prompt)


def _refusal(rank: int, what: str) -> RankInputError:
    if rank == STDIN_RANK:  # a rank 0 started without a replies pipe (an engine that has none)
        return RankInputError(f"rank 0 called {what}, but this launch has no channel to the notebook's input.")
    return RankInputError(
        f"only rank 0 can read from the notebook; rank {rank} called {what}. Ask on rank 0 and share the "
        "answer with torch.distributed.broadcast_object_list(), or pass the value into the launch as an argument."
    )


def _refusing_input(rank: int):
    def input(prompt=""):
        if _is_debugger_prompt(str(prompt)):
            raise RankInputError(
                f"pdb was started on rank {rank}, but this launch has no channel to the notebook's input "
                f"(its engine relays none): print what you need on rank {rank} (its output is in its log file)."
            )
        raise _refusal(rank, f"input({str(prompt)!r})")

    return input


def _refusing_getpass(rank: int):
    def getpass(prompt="Password: ", stream=None):
        raise _refusal(rank, "getpass()")

    return getpass


def _refusing_breakpoint(rank: int):
    def breakpointhook(*args, **kwargs):
        if os.environ.get("PYTHONBREAKPOINT") == "0":
            return None  # breakpoints switched off, as Python's own hook would
        raise RankInputError(
            f"breakpoint() on rank {rank}: this launch has no channel to the notebook's input (its engine "
            f"relays none), so no debugger can be driven from the cell; print what you need on rank {rank} "
            "(its output is in its log file)."
        )

    return breakpointhook
