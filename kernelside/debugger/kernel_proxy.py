"""JupyterLab's debugger panel, reaching the ranks through the kernel's own debugger.

JupyterLab sends every DAP request as a ``debug_request`` on the control channel, and ipykernel hands it to
its debugger's ``process_request``. ``install()`` (at ``%load_ext kernelside``) puts nblaunch in front of that
method: each request goes where ``routes.ROUTES`` says (the kernel's debugger, every rank, or the one rank
whose thread, frame or variable it names); a rank's answer comes back with the panel's ids; what the panel
sets (breakpoints, exception filters) is kept for the ranks of later launches (``RankAdapters``). Nothing
changes for the kernel's own debugging: its requests, ids and answers pass through untouched.

Waiting for a rank never blocks the control thread's loop (its other requests, and the kernel's own
debugger, go on), and never uses a thread the kernel's debugger could suspend.

Example::

    install(get_ipython().kernel)      # %load_ext kernelside does this
    ranks_debugger_address()           # '127.0.0.1:41233:…' while breakpoints are set, else ''
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from .dap_connection import DapClosed
from .rank_adapters import RELEASE, RankAdapters
from .routes import ROUTES, Route, inward, outward, panel_id_of, thread_name

ANSWER_TIMEOUT_S = 30.0
RELEASE_TIMEOUT_S = 5.0

# Global on purpose: a kernel process has one debugger, and the launches of its cells read this one.
_installed: dict = {}


def install(kernel) -> RankAdapters | None:
    """Route the kernel debugger's requests through nblaunch (once per kernel); None without one."""
    debugger = getattr(kernel, "debugger", None)
    if debugger is None or not hasattr(debugger, "process_request"):
        return None
    if "adapters" in _installed:
        return _installed["adapters"]
    adapters = RankAdapters(publish=kernel._publish_debug_event)
    original = debugger.process_request

    async def process_request(message):
        return await route(message, original, adapters)

    debugger.process_request = process_request
    _installed.update(adapters=adapters, debugger=debugger)
    return adapters


def ranks_debugger_address() -> str:
    """What the ranks of a launch starting now connect their debugger to; '' when they run undebugged
    (the kernel's debugger off, or nothing set in the panel that could stop them)."""
    adapters, debugger = _installed.get("adapters"), _installed.get("debugger")
    if adapters is None or not getattr(debugger, "is_started", False) or not adapters.wanted():
        return ""
    return adapters.address()


async def route(message: dict, original, adapters: RankAdapters) -> dict:
    command = message.get("command")
    arguments = message.get("arguments") or {}
    how = ROUTES.get(command, Route.KERNEL)
    if how in (Route.BY_THREAD, Route.BY_FRAME, Route.BY_REFERENCE):
        owner = adapters.ids.inward(panel_id_of(how, arguments))
        if owner is None:
            return await original(message)
        return await _ask_rank(message, owner[0], adapters)
    if how is Route.RELEASE:
        sent = []
        for a in adapters.forget_panel():
            with contextlib.suppress(DapClosed):
                sent.append((a.conn, a.conn.send(*RELEASE)))
        deadline = time.monotonic() + RELEASE_TIMEOUT_S  # (one wait for all: a rank that cannot answer is dropped)
        for conn, done in sent:
            with contextlib.suppress(DapClosed, TimeoutError):
                await _answer(conn, done, max(deadline - time.monotonic(), 0.0))
            conn.close()
        return await original(message)
    reply = await original(message)
    if how is Route.EVERY and command == "setBreakpoints":
        adapters.set_breakpoints(arguments)
    elif how is Route.EVERY:
        adapters.set_exception_breakpoints(arguments)
    elif how is Route.THREADS and reply.get("success", True):
        reply.setdefault("body", {}).setdefault("threads", []).extend(await _rank_threads(adapters))
    elif how is Route.INFO and isinstance(reply.get("body"), dict):
        reply["body"]["stoppedThreads"] = list(reply["body"].get("stoppedThreads", [])) + adapters.stopped_threads()
    return reply


async def _ask_rank(message: dict, rank: int, adapters: RankAdapters) -> dict:
    command = message["command"]
    reply = {"type": "response", "request_seq": message.get("seq"), "command": command, "seq": 0}
    a = adapters.adapter(rank)
    if a is None:
        return {**reply, "success": False, "message": f"rank {rank} is no longer running"}
    arguments = inward(message.get("arguments") or {}, adapters.ids)
    if command == "richInspectVariables":
        return await _rich_inspect(reply, a, arguments)
    try:
        answer = await _answer(a.conn, a.conn.send(command, arguments), ANSWER_TIMEOUT_S)
    except (DapClosed, TimeoutError) as e:
        return {**reply, "success": False, "message": str(e)}
    if command in ("continue", "next", "stepIn", "stepOut"):
        adapters.ids.forget(rank)
    out = {
        **reply,
        "success": answer.get("success", False),
        "body": outward(command, answer.get("body"), rank, adapters.ids),
    }
    if "message" in answer:
        out["message"] = answer["message"]
    return out


async def _rich_inspect(reply: dict, a, arguments: dict) -> dict:
    """The panel's rich view of a rank's variable: its text (a rank has no IPython display formatter)."""
    name = arguments.get("variableName", "")
    if not str(name).isidentifier():
        return {**reply, "success": True, "body": {"data": {}, "metadata": {}}}
    ask = {"expression": name, "frameId": arguments.get("frameId"), "context": "clipboard"}
    try:
        answer = await _answer(a.conn, a.conn.send("evaluate", ask), ANSWER_TIMEOUT_S)
    except (DapClosed, TimeoutError) as e:
        return {**reply, "success": False, "message": str(e)}
    data = {"text/plain": (answer.get("body") or {}).get("result", "")} if answer.get("success") else {}
    return {**reply, "success": True, "body": {"data": data, "metadata": {}}}


async def _rank_threads(adapters: RankAdapters) -> list[dict]:
    threads = []
    for a in adapters.connected():
        try:
            answer = await _answer(a.conn, a.conn.send("threads"), ANSWER_TIMEOUT_S)
        except (DapClosed, TimeoutError):
            continue
        for t in (answer.get("body") or {}).get("threads", []):
            a.threads[t["id"]] = t.get("name")
            threads.append(
                {"id": adapters.ids.outward(a.rank, "thread", t["id"]), "name": thread_name(a.rank, t.get("name"))}
            )
    return threads


async def _answer(conn, done, timeout: float) -> dict:
    """``conn.answer(done)``, waited for on the control thread's loop without blocking it."""
    deadline = time.monotonic() + timeout
    while not done.is_set() and time.monotonic() < deadline:
        await asyncio.sleep(0.005)
    if not done.is_set():
        with contextlib.suppress(TimeoutError):
            conn.answer(done, 0)  # (no longer waited for)
        raise TimeoutError(f"{conn.name}'s debugger did not answer in {timeout:.0f}s")
    return conn.answer(done, 0)
