"""The kernel's debugger driven as JupyterLab drives it: Debug Adapter Protocol requests as ``debug_request``
messages on the control channel, their answers as ``debug_reply`` there, its events as ``debug_event`` on IOPub.

JupyterLab's debugger service, when the notebook's bug switch is turned on, sends ``debugInfo``, then
``initialize`` (with the arguments below), ``attach`` and ``configurationDone``; turning it off sends
``disconnect`` (``restart: False, terminateDebuggee: True``)."""

from __future__ import annotations

import queue
import time

from kernel import Cell, Kernel

# what @jupyterlab/debugger's session sends with initialize (its DebugSession.start)
INITIALIZE = {
    "clientID": "jupyterlab",
    "clientName": "JupyterLab",
    "adapterID": "python",
    "pathFormat": "path",
    "linesStartAt1": True,
    "columnsStartAt1": True,
    "supportsVariableType": True,
    "supportsVariablePaging": True,
    "supportsRunInTerminalRequest": True,
    "locale": "en",
}


class KernelDebugger:
    """A DAP client of one kernel's debugger. ``start()`` is the switch turned on, ``stop()`` turned off."""

    def __init__(self, kernel: Kernel):
        self.kernel = kernel
        self.seq = 0
        self.events: list[dict] = []  # every debug_event body seen, in order
        kernel.on_stray = self._stray

    def request(self, command: str, arguments: dict | None = None, timeout: float = 30) -> dict:
        """Send one DAP request and return its response (the debug_reply's content)."""
        self.seq += 1
        content = {"type": "request", "seq": self.seq, "command": command, "arguments": arguments or {}}
        msg = self.kernel.kc.session.msg("debug_request", content)
        self.kernel.kc.control_channel.send(msg)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no debug_reply to {command} in {timeout}s")
            try:
                reply = self.kernel.kc.control_channel.get_msg(timeout=left)
            except queue.Empty:
                continue
            if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                return reply["content"]

    def start(self) -> dict:
        """The notebook's debugger switch turned on: what JupyterLab sends, in its order; debugInfo's body."""
        self.request("debugInfo")
        assert self.request("initialize", INITIALIZE)["success"], "the kernel's debugger did not initialize"
        assert self.request("attach", {})["success"], "the kernel's debugger did not attach"
        assert self.request("configurationDone")["success"]
        return self.request("debugInfo")["body"]

    def stop(self) -> dict:
        """The switch turned off."""
        return self.request("disconnect", {"restart": False, "terminateDebuggee": True})

    def wait_event(self, name: str, timeout: float = 60, where=lambda body: True) -> dict:
        """The next ``name`` event (its whole DAP message) whose body passes ``where``, read off IOPub; the
        other messages read meanwhile are put back for the cell's own wait."""
        seen = len(self.events)
        deadline = time.monotonic() + timeout
        put_back = []
        try:
            while True:
                for event in self.events[seen:]:
                    if event["event"] == name and where(event.get("body", {})):
                        return event
                seen = len(self.events)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no {name} event in {timeout}s; events: {[e['event'] for e in self.events]}")
                try:
                    msg = self.kernel.kc.get_iopub_msg(timeout=min(left, 0.5))
                except queue.Empty:
                    continue
                if msg["msg_type"] == "debug_event":
                    self.events.append(msg["content"])
                else:
                    put_back.append(msg)
        finally:
            self.kernel.pending_iopub.extend(put_back)

    def _stray(self, msg: dict) -> None:
        if msg["msg_type"] == "debug_event":
            self.events.append(msg["content"])


# -- what the panel does, as the tests of ranks in the panel use it ---------------------------------------------
def set_breakpoints(d: KernelDebugger, cell: str, lines) -> str:
    """What JupyterLab does on a click in the cell's gutter: the cell dumped, its breakpoints set."""
    source = d.request("dumpCell", {"code": cell})["body"]["sourcePath"]
    reply = d.request("setBreakpoints", {"source": {"path": source}, "breakpoints": [{"line": n} for n in lines]})
    assert reply["success"], reply
    return source


def clear_breakpoints(d: KernelDebugger, source: str) -> None:
    d.request("setBreakpoints", {"source": {"path": source}, "breakpoints": []})


def continue_all(d: KernelDebugger, threads) -> None:
    """Continue each of ``threads`` (stopped ranks), one request each, as the panel's Continue does."""
    for thread in threads:
        d.request("continue", {"threadId": thread})


def start(k: Kernel, code: str) -> Cell:
    cell = Cell()
    cell.msg_id = k.kc.execute(code)
    return cell


def stopped_ranks(d: KernelDebugger, n: int, timeout: float = 120) -> dict[str, int]:
    """Wait for ``n`` stopped rank threads; {"rank N": panel thread id}."""
    seen: dict[str, int] = {}
    deadline = time.monotonic() + timeout
    while len(seen) < n:
        left = deadline - time.monotonic()
        event = d.wait_event("stopped", timeout=max(left, 0.1), where=lambda b: b["threadId"] not in seen.values())
        names = {t["id"]: t["name"] for t in d.request("threads")["body"]["threads"]}
        seen[names[event["body"]["threadId"]]] = event["body"]["threadId"]
    return seen


def frame_variables(d: KernelDebugger, thread: int) -> tuple[dict, dict]:
    """The top frame of ``thread`` and its local variables by name (name → value text)."""
    frame = d.request("stackTrace", {"threadId": thread})["body"]["stackFrames"][0]
    scopes = d.request("scopes", {"frameId": frame["id"]})["body"]["scopes"]
    found = {}
    for scope in scopes:
        for v in d.request("variables", {"variablesReference": scope["variablesReference"]})["body"]["variables"]:
            found.setdefault(v["name"], v["value"])
    return frame, found
