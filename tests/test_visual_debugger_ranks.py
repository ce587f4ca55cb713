"""JupyterLab's debugger panel reaches every rank: breakpoints in a ``%%distributed`` cell stop the ranks.

A real kernel's debugger is driven as JupyterLab drives it (tests/kernel_debugger.py): the switch on, then
``dumpCell`` and ``setBreakpoints`` on the cell's text as the gutter sets them, the cell run, and the panel's
requests (``threads``, ``stackTrace``, ``scopes``, ``variables``, ``continue``, ``next``, ``disconnect``) on
the threads the ``stopped`` events name. Ranks are real processes with torch.distributed (gloo)."""

from __future__ import annotations

import time

import pytest
from kernel import Cell, Kernel
from kernel_debugger import KernelDebugger

pytestmark = pytest.mark.kernel  # starts kernels

TWO_RANKS = "%%distributed -n 2 --return-from all --return here\n"


@pytest.fixture(scope="module")
def debugged(tmp_path_factory):
    k = Kernel(cwd=str(tmp_path_factory.mktemp("visual_debugger_ranks")))
    d = KernelDebugger(k)
    assert d.start()["isStarted"]
    k.run("%load_ext kernelside").ok()
    yield k, d
    d.stop()
    k.shutdown()


def set_breakpoints(d: KernelDebugger, cell: str, lines) -> str:
    """What JupyterLab does on a click in the cell's gutter: the cell dumped, its breakpoints set."""
    source = d.request("dumpCell", {"code": cell})["body"]["sourcePath"]
    reply = d.request("setBreakpoints", {"source": {"path": source}, "breakpoints": [{"line": n} for n in lines]})
    assert reply["success"], reply
    return source


def clear_breakpoints(d: KernelDebugger, source: str) -> None:
    d.request("setBreakpoints", {"source": {"path": source}, "breakpoints": []})


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


def test_a_breakpoint_on_line_3_stops_both_ranks_with_their_rank_and_locals(debugged):
    k, d = debugged
    code = TWO_RANKS + "here = rank * 10\nsecret = here + 1\nprint('past', rank, flush=True)\n"
    source = set_breakpoints(d, code, [3])
    cell = start(k, code)
    try:
        ranks = stopped_ranks(d, 2)
        assert sorted(ranks) == ["rank 0", "rank 1"]
        for name, thread in ranks.items():
            r = int(name.split()[1])
            frame, local = frame_variables(d, thread)
            assert frame["source"]["path"] == source and frame["line"] == 3, frame
            assert local["rank"] == str(r) and local["here"] == str(10 * r), local
            assert "secret" not in local  # line 3 has not run yet
    finally:
        clear_breakpoints(d, source)
        for thread in ranks.values():
            d.request("continue", {"threadId": thread})
    k.wait(cell, 120)
    assert cell.reply["status"] == "ok", cell.outputs
    assert k.run("here").result["text/plain"] == "[0, 10]"
    assert k.children() == []
