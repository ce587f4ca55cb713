"""Where each DAP request of JupyterLab's debugger panel goes: the kernel's own debugger, every rank, or one.

One table (``ROUTES``) says it per command; a command not in it is the kernel's (ipykernel's own handling,
unchanged). A request that names a thread, frame or variable reference goes to whoever made that id
(``DapIds``): a rank's id to that rank alone, translated to its own numbers, and the answer's ids made the
panel's again (``outward``).

Example::

    >>> ROUTES["stackTrace"], ROUTES["setBreakpoints"], ROUTES.get("dumpCell", Route.KERNEL)
    (<Route.BY_THREAD: 'threadId'>, <Route.EVERY: 'every'>, <Route.KERNEL: 'kernel'>)
"""

from __future__ import annotations

import enum


class Route(enum.Enum):
    KERNEL = "kernel"  # the kernel's debugger alone (dumpCell, source, inspectVariables, ...)
    EVERY = "every"  # the kernel's, then every rank's (the rank keeps it for ranks that connect later)
    THREADS = "threads"  # the kernel's threads, then each rank's, named "rank N"
    INFO = "info"  # the kernel's answer, with the ranks' stopped threads added
    RELEASE = "release"  # every rank released (breakpoints gone, threads running), then the kernel's
    PAUSE = "pause"  # a rank's thread: that thread; a thread of no rank: every rank's threads, and the kernel's
    BY_THREAD = "threadId"  # whoever's thread the request names
    BY_FRAME = "frameId"
    BY_REFERENCE = "variablesReference"


ROUTES = {
    "setBreakpoints": Route.EVERY,
    "setExceptionBreakpoints": Route.EVERY,
    "threads": Route.THREADS,
    "debugInfo": Route.INFO,
    "disconnect": Route.RELEASE,
    "stackTrace": Route.BY_THREAD,
    "continue": Route.BY_THREAD,
    "next": Route.BY_THREAD,
    "stepIn": Route.BY_THREAD,
    "stepOut": Route.BY_THREAD,
    "pause": Route.PAUSE,
    "exceptionInfo": Route.BY_THREAD,
    "scopes": Route.BY_FRAME,
    "evaluate": Route.BY_FRAME,
    "completions": Route.BY_FRAME,
    "richInspectVariables": Route.BY_FRAME,
    "copyToGlobals": Route.BY_FRAME,
    "variables": Route.BY_REFERENCE,
    "setVariable": Route.BY_REFERENCE,
}

# the argument that holds each id kind, for requests sent to a rank
ARGUMENT_KIND = {"threadId": "thread", "frameId": "frame", "srcFrameId": "frame", "variablesReference": "ref"}


def panel_id_of(route: Route, arguments: dict):
    """The id a request is routed by (None: no id, the kernel's)."""
    if route is Route.BY_FRAME:
        return arguments.get("frameId", arguments.get("srcFrameId"))
    return arguments.get(route.value)


def inward(arguments: dict, ids) -> dict:
    """The request's arguments with the panel's ids made the rank's own numbers."""
    out = dict(arguments)
    for key in ARGUMENT_KIND:
        found = ids.inward(out.get(key))
        if found is not None:
            out[key] = found[2]
    return out


def outward(command: str, body: dict, rank: int, ids) -> dict:
    """A rank's answer with its ids made the panel's (and what it says of "all threads" made its own)."""
    body = dict(body or {})
    if command == "stackTrace":
        body["stackFrames"] = [{**f, "id": ids.outward(rank, "frame", f["id"])} for f in body.get("stackFrames", [])]
    elif command == "scopes":
        body["scopes"] = [_ref(s, rank, ids) for s in body.get("scopes", [])]
    elif command == "variables":
        body["variables"] = [_ref(v, rank, ids) for v in body.get("variables", [])]
    elif "variablesReference" in body:
        body = _ref(body, rank, ids)
    if "allThreadsContinued" in body:
        body["allThreadsContinued"] = False  # the other ranks stay as they are
    return body


def _ref(item: dict, rank: int, ids) -> dict:
    ref = item.get("variablesReference")
    if not ref:
        return item
    return {**item, "variablesReference": ids.outward(rank, "ref", ref)}


def thread_name(rank: int, name: str) -> str:
    """How the panel names a rank's thread: "rank 1" for its main thread, "rank 1: loader" for others."""
    return f"rank {rank}" if name in ("MainThread", None, "") else f"rank {rank}: {name}"
