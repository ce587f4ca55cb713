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
import dataclasses
import time

from . import rank_values
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
    shell = getattr(kernel, "shell", None)
    _installed.update(adapters=adapters, debugger=debugger, namespace=getattr(shell, "user_ns", None))
    return adapters


def ranks_debugger_address(stops_itself: bool = False) -> str:
    """What the ranks of a launch starting now connect their debugger to; '' when they run undebugged
    (the kernel's debugger off, or nothing set in the panel that could stop them). ``stops_itself``: the
    code calls ``breakpoint()``, which stops in the panel while the debugger is on, set or not."""
    adapters, debugger = _installed.get("adapters"), _installed.get("debugger")
    if adapters is None or not getattr(debugger, "is_started", False):
        return ""
    return adapters.address() if stops_itself or adapters.wanted() else ""


ENGINE_WORDS = {"elastic": "torch's elastic launcher (several machines)", "ray": "Ray"}


def for_engine(engine: str, fn):
    """(``fn`` as ranks on ``engine`` run it, the one line the launch says first, or '').

    JupyterLab's debugger reaches the ranks of this machine's engine only (a debugged rank connects to the
    kernel's loopback listener): on another engine, while the debugger is on, the launch says so once and
    runs, and a cell's ranks do not try to connect (``notebook.cell.CellProgram.debugger`` emptied).

    Example::

        fn, note = for_engine("ray", program)   # note: "nblaunch: JupyterLab's debugger does not reach ..."
    """
    debugger = _installed.get("debugger")
    if engine == "local" or not getattr(debugger, "is_started", False):
        return fn, ""
    if getattr(fn, "debugger", "") and dataclasses.is_dataclass(fn):
        fn = dataclasses.replace(fn, debugger="")
    words = ENGINE_WORDS.get(engine, engine)
    note = (
        f"nblaunch: JupyterLab's debugger does not reach ranks on {words}: this launch runs without it "
        "(its breakpoints stop ranks of this machine's launches, and plain cells)."
    )
    return fn, note


async def route(message: dict, original, adapters: RankAdapters) -> dict:
    command = message.get("command")
    arguments = message.get("arguments") or {}
    how = ROUTES.get(command, Route.KERNEL)
    if how in (Route.BY_THREAD, Route.BY_FRAME, Route.BY_REFERENCE):
        owner = adapters.ids.inward(panel_id_of(how, arguments))
        if owner is None:
            return await original(message)
        return await _ask_rank(message, owner[0], adapters)
    if how is Route.PAUSE:
        return await _pause(message, original, adapters)
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
    if command in ("richInspectVariables", "copyToGlobals"):
        return await _rank_value(command, reply, a, arguments)
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
    if command == "variables":
        _hide_kernel_names(out.get("body") or {})
    return out


def _hide_kernel_names(body: dict) -> None:
    """A rank's variables as the kernel's debugger shows a plain cell's: without the names it hides there
    (``debugpy``, ``In``, ``Out``, ``_i1``, ...). A forked rank's globals are the notebook's, debugpy (which the
    kernel's debugger imports into them) included; the kernel's debugger's own rule says what to hide."""
    accept = getattr(_installed.get("debugger"), "accept_variable", None)
    if callable(accept) and isinstance(body.get("variables"), list):
        body["variables"] = [v for v in body["variables"] if accept(str(v.get("name", "")))]


async def _pause(message: dict, original, adapters: RankAdapters) -> dict:
    """``pause`` of a rank's thread pauses that rank. Of any other thread (JupyterLab's panel names thread 1
    when nothing is stopped), while ranks are connected: every rank not stopped yet; the kernel's own threads
    run on (its main thread serves the launch: paused, no rank's output, stop or end would reach the cell).
    With no rank connected it is the kernel's, as before.

    A rank pauses all its threads (pydevd's ``"*"``): its pause of one thread by id stops that thread in a
    frame of no line (line 0), where the panel shows nothing and an evaluation changes nothing."""
    owner = adapters.ids.inward((message.get("arguments") or {}).get("threadId"))
    ranks = adapters.connected()
    if owner is None and not ranks:
        return await original(message)
    if owner is not None:
        ranks = [a for a in ranks if a.rank == owner[0]]
    sent = []
    for a in ranks:
        if not a.stopped:  # (a stopped rank paused again would leave the line it is stopped on)
            with contextlib.suppress(DapClosed):
                sent.append((a.conn, a.conn.send("pause", {"threadId": "*"})))
    for conn, done in sent:
        with contextlib.suppress(DapClosed, TimeoutError):
            await _answer(conn, done, ANSWER_TIMEOUT_S)
    return {"type": "response", "request_seq": message.get("seq"), "command": "pause", "seq": 0, "success": True}


async def _rank_value(command: str, reply: dict, a, arguments: dict) -> dict:
    """A rank's variable shown richly, or copied to the globals (``rank_values``): one ``evaluate`` in its frame."""
    rich = command == "richInspectVariables"
    ask = rank_values.rich_request(arguments) if rich else rank_values.copy_request(arguments)
    if ask is None:
        if rich:
            return {**reply, "success": True, "body": dict(rank_values.NOTHING)}
        return {**reply, "success": False, "message": "dstVariableName and srcVariableName must be identifiers"}
    try:
        answer = await _answer(a.conn, a.conn.send("evaluate", ask), ANSWER_TIMEOUT_S)
    except (DapClosed, TimeoutError) as e:
        return {**reply, "success": False, "message": str(e)}
    if rich:
        return {**reply, "success": True, "body": rank_values.rich_body(answer)}
    name = arguments["dstVariableName"]
    try:
        value = rank_values.copied_value(answer)
    except Exception as e:  # noqa: BLE001 - what the rank could not send is said, the panel goes on
        return {**reply, "success": False, "message": f"rank {a.rank} could not copy {name}: {e}"}
    namespace = _installed.get("namespace")
    if namespace is not None:
        namespace[name] = value  # the notebook's globals: the next cell sees the rank's value
    return {**reply, "success": True, "body": {"value": repr(value)[:200], "variablesReference": 0}}


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
