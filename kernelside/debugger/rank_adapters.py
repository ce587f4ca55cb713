"""The ranks' debuggers, as the kernel holds them: one DAP connection per debugged rank.

While JupyterLab's debugger is on and something could stop a rank (a breakpoint, or exception breakpoints),
each rank a launch starts runs a debugpy of its own (``rank_side.connect``), which connects to the listening
socket here (loopback only) and proves it is this kernel's rank with a per-kernel secret and its rank number
(its pydevd access token: anyone else on the machine who connects is dropped). The kernel then configures it
as JupyterLab configured the kernel: ``initialize``, ``attach`` (nblaunch's own files hidden from the stack),
the breakpoints and exception filters the panel set, ``configurationDone``; only then does the rank run its
code. Breakpoints the panel changes later reach every connected rank at once.

Events of a rank (``stopped``, ``continued``, ``thread``) reach ``publish`` with the rank's ids made the
panel's (``DapIds``); a rank that ends closes its connection, and its threads leave the panel.

Example::

    adapters = RankAdapters(publish=kernel._publish_debug_event)
    adapters.address()          # '127.0.0.1:41233:3f0c…' (what each rank of the next launch connects to)
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import socket
import threading

from .dap_connection import DapClosed, DapConnection
from .dap_ids import DapIds
from .undebugged import undebugged

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGURE_TIMEOUT_S = 30.0
RELEASE = ("disconnect", {"restart": False, "terminateDebuggee": False})

# what the kernel's adapter says of itself to a rank's pydevd (as JupyterLab's client says it to the kernel)
INITIALIZE = {
    "clientID": "nblaunch",
    "clientName": "nblaunch kernel",
    "adapterID": "python",
    "pathFormat": "path",
    "linesStartAt1": True,
    "columnsStartAt1": True,
    "supportsVariableType": True,
    "supportsVariablePaging": True,
}
ATTACH = {
    "justMyCode": True,
    "rules": [{"path": PACKAGE_DIR, "include": False}],  # nblaunch's frames are not the user's
    "subProcess": False,  # a DataLoader worker is no rank: it never connects back
    "redirectOutput": False,  # the rank's output already reaches the cell through its pipes
}


@dataclasses.dataclass
class RankAdapter:
    rank: int
    conn: DapConnection
    threads: dict = dataclasses.field(default_factory=dict)  # local thread id → name
    stopped: set = dataclasses.field(default_factory=set)  # local ids of its stopped threads


class RankAdapters:
    def __init__(self, publish):
        self.publish = publish  # (event) → debug_event on IOPub
        self.ids = DapIds()
        self.secret = secrets.token_hex(16)
        self.lock = threading.Lock()
        self.ranks: dict[int, RankAdapter] = {}
        self.breakpoints: dict[str, dict] = {}  # source path → the panel's setBreakpoints arguments
        self.exception_filters: dict | None = None  # the panel's setExceptionBreakpoints arguments
        self.listener: socket.socket | None = None

    # -- what a launch asks -----------------------------------------------------------------
    def wanted(self) -> bool:
        """Something set in the panel could stop a rank: ranks of a launch started now should be debugged."""
        with self.lock:
            bps = any(a.get("breakpoints") for a in self.breakpoints.values())
            filters = bool(self.exception_filters and self.exception_filters.get("filters"))
            return bps or filters

    def address(self) -> str:
        """``host:port:secret`` for ``rank_side.connect`` (the listener opens on first use)."""
        with self.lock:
            if self.listener is None:
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.bind(("127.0.0.1", 0))
                sock.listen(64)
                self.listener = sock
                thread = threading.Thread(target=self._accept, args=(sock,), name="nblaunch-rank-debug", daemon=True)
                undebugged(thread).start()
            port = self.listener.getsockname()[1]
        return f"127.0.0.1:{port}:{self.secret}"

    # -- the panel's settings, kept for ranks that connect later ------------------------------
    def set_breakpoints(self, arguments: dict) -> None:
        with self.lock:
            self.breakpoints[arguments["source"]["path"]] = arguments
            adapters = list(self.ranks.values())
        for a in adapters:
            a.conn.send("setBreakpoints", arguments, keep=False)

    def set_exception_breakpoints(self, arguments: dict) -> None:
        arguments = for_ranks(arguments)
        with self.lock:
            self.exception_filters = arguments
            adapters = list(self.ranks.values())
        for a in adapters:
            a.conn.send("setExceptionBreakpoints", arguments, keep=False)

    def adapter(self, rank: int) -> RankAdapter | None:
        with self.lock:
            return self.ranks.get(rank)

    def connected(self) -> list[RankAdapter]:
        with self.lock:
            return sorted(self.ranks.values(), key=lambda a: a.rank)

    def stopped_threads(self) -> list[int]:
        return [self.ids.outward(a.rank, "thread", t) for a in self.connected() for t in sorted(a.stopped)]

    def forget_panel(self) -> list[RankAdapter]:
        """The debugger switched off: nothing the panel set stays; the connected ranks, to release
        (``RELEASE``: a pydevd told so removes its breakpoints and resumes every thread)."""
        with self.lock:
            self.breakpoints.clear()
            self.exception_filters = None
            return list(self.ranks.values())

    # -- ranks connecting ---------------------------------------------------------------------
    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                sock, _ = listener.accept()
            except OSError:
                return  # closed
            undebugged(threading.Thread(target=self._configure, args=(sock,), daemon=True)).start()

    def _configure(self, sock: socket.socket) -> None:
        holder: dict = {}
        conn = DapConnection(sock, on_event=lambda event: self._on_event(holder.get("rank"), event), name="a rank")
        try:
            token = conn.request("pydevdAuthorize", {"debugServerAccessToken": None}, timeout=CONFIGURE_TIMEOUT_S)
            rank = self._rank_of((token.get("body") or {}).get("clientAccessToken"))
            if rank is None:
                conn.close()  # not one of this kernel's ranks
                return
            conn.name = f"rank {rank}"
            with self.lock:
                old = self.ranks.get(rank)
                self.ranks[rank] = RankAdapter(rank, conn)
                holder["rank"] = rank
                breakpoints = list(self.breakpoints.values())
                filters = self.exception_filters
            if old is not None:
                old.conn.close()  # an earlier launch's rank of the same number
            conn.request("initialize", INITIALIZE, timeout=CONFIGURE_TIMEOUT_S)
            conn.request("attach", ATTACH, timeout=CONFIGURE_TIMEOUT_S)
            for arguments in breakpoints:
                conn.request("setBreakpoints", arguments, timeout=CONFIGURE_TIMEOUT_S)
            if filters is not None:
                conn.request("setExceptionBreakpoints", filters, timeout=CONFIGURE_TIMEOUT_S)
            conn.request("configurationDone", timeout=CONFIGURE_TIMEOUT_S)  # the rank runs its code from here
        except (DapClosed, TimeoutError, OSError):
            conn.close()

    def _rank_of(self, token) -> int | None:
        secret, _, rank = str(token or "").partition(":")
        if not secrets.compare_digest(secret, self.secret) or not rank.isdigit():
            return None
        return int(rank)

    def _on_event(self, rank, event: dict) -> None:
        if rank is None:
            return
        a = self.adapter(rank)
        if a is None:
            return
        name, body = event.get("event"), dict(event.get("body") or {})
        if name == "nblaunch:closed":
            self._gone(a)
            return
        local = body.get("threadId")
        if name == "thread":
            if body.get("reason") == "started":
                a.threads.setdefault(local, None)
            elif body.get("reason") == "exited":
                a.threads.pop(local, None)
                a.stopped.discard(local)
        elif name == "stopped":
            a.stopped.add(local)
            body["allThreadsStopped"] = False  # the rank's threads; the other ranks run on
        elif name == "continued":
            if body.get("allThreadsContinued", True):
                a.stopped.clear()
            else:
                a.stopped.discard(local)
            body["allThreadsContinued"] = False
            self.ids.forget(rank)
        else:
            return  # output, modules, process: the kernel's own debugger says what the panel needs
        if local is not None:
            body["threadId"] = self.ids.outward(rank, "thread", local)
        self.publish({**event, "body": body})

    def _gone(self, a: RankAdapter) -> None:
        with self.lock:
            if self.ranks.get(a.rank) is a:
                del self.ranks[a.rank]
            else:
                return
        for panel_id in self.ids.threads_of(a.rank):
            self.publish(
                {"type": "event", "event": "thread", "seq": 0, "body": {"reason": "exited", "threadId": panel_id}}
            )
        self.ids.forget(a.rank, kinds=("thread", "frame", "ref"))


def for_ranks(arguments: dict) -> dict:
    """The panel's exception filters as a rank needs them. "uncaught": nblaunch itself catches what fails in a
    rank (to report it to the kernel), so pydevd would never see it uncaught; what leaves the user's code
    into nblaunch's frames is pydevd's "userUnhandled", the same moment, in the user's frame."""
    filters = list(arguments.get("filters") or [])
    if "uncaught" in filters and "userUnhandled" not in filters:
        filters.append("userUnhandled")
    return {**arguments, "filters": filters}
