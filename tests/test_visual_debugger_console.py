"""The debugger panel on a rank, past the cell itself: a breakpoint in a file the cell imports (as JupyterLab
sets one in a file opened in its editor) stops every rank there; the debug console evaluates in the chosen
rank's frame; step in and step out move between the cell and the file for that rank alone.

A real kernel's debugger driven as JupyterLab drives it (tests/kernel_debugger.py); ranks are real processes
with torch.distributed (gloo)."""

from __future__ import annotations

import pytest
from kernel import Kernel
from kernel_debugger import KernelDebugger, clear_breakpoints, continue_all, set_breakpoints, start, stopped_ranks

pytestmark = pytest.mark.kernel  # starts kernels

SHAPES = "def scaled(v, k):\n    doubled = v * 2\n    return doubled * k\n"
CELL = (
    "%%distributed -n 2 --return-from all --return out\nimport shapes\nbase = rank + 1\nout = shapes.scaled(base, 3)\n"
)


@pytest.fixture(scope="module")
def debugged(tmp_path_factory):
    folder = tmp_path_factory.mktemp("visual_debugger_console")
    (folder / "shapes.py").write_text(SHAPES)
    k = Kernel(cwd=str(folder))
    d = KernelDebugger(k)
    assert d.start()["isStarted"]
    k.run("%load_ext kernelside").ok()
    yield k, d, folder
    d.stop()
    k.shutdown()


def _top(d: KernelDebugger, thread: int) -> dict:
    return d.request("stackTrace", {"threadId": thread})["body"]["stackFrames"][0]


def _evaluate(d: KernelDebugger, thread: int, expression: str) -> dict:
    """What the debug console sends for ``expression`` with the rank's top frame selected."""
    return d.request("evaluate", {"expression": expression, "frameId": _top(d, thread)["id"], "context": "repl"})


def test_a_breakpoint_in_an_imported_file_stops_every_rank_and_the_console_evaluates_in_each(debugged):
    k, d, folder = debugged
    path = str(folder / "shapes.py")
    reply = d.request("setBreakpoints", {"source": {"path": path}, "breakpoints": [{"line": 3}]})
    assert reply["success"], reply
    cell = start(k, CELL)
    ranks = stopped_ranks(d, 2)
    try:
        for name, thread in ranks.items():
            frame = _top(d, thread)
            assert (frame["source"]["path"], frame["line"]) == (path, 3), frame
            rank = int(name.split()[1])
            got = _evaluate(d, thread, "doubled + 0.5")
            assert got["success"] and got["body"]["result"] == str(2 * (rank + 1) + 0.5), got
        # evaluation runs in that rank: an assignment there is seen by that rank only
        assert _evaluate(d, ranks["rank 1"], "k = 10")["success"]
    finally:
        d.request("setBreakpoints", {"source": {"path": path}, "breakpoints": []})
        continue_all(d, ranks.values())
    k.wait(cell, 120)
    assert cell.reply["status"] == "ok", cell.outputs
    assert k.run("out").result["text/plain"] == "[6, 40]"  # rank 0: 1*2*3; rank 1: 2*2*10, its k changed


def test_step_in_enters_the_imported_file_and_step_out_comes_back_to_the_cell_for_one_rank(debugged):
    k, d, folder = debugged
    source = set_breakpoints(d, CELL, [4])  # out = shapes.scaled(base, 3), by the notebook's numbering
    cell = start(k, CELL)
    ranks = stopped_ranks(d, 2)
    one, other = ranks["rank 1"], ranks["rank 0"]
    try:
        d.request("stepIn", {"threadId": one})
        d.wait_event("stopped", where=lambda b: b["threadId"] == one and b["reason"] == "step")
        inside = _top(d, one)
        assert (inside["source"]["path"], inside["line"]) == (str(folder / "shapes.py"), 2), inside
        assert _top(d, other)["line"] == 4  # rank 0 stays where it stopped
        d.request("stepOut", {"threadId": one})
        d.wait_event("stopped", where=lambda b: b["threadId"] == one and b["reason"] == "step")
        back = _top(d, one)
        assert back["source"]["path"] == source and back["line"] == 4, back
    finally:
        clear_breakpoints(d, source)
        continue_all(d, ranks.values())
    k.wait(cell, 120)
    assert cell.reply["status"] == "ok", cell.outputs
    assert k.run("out").result["text/plain"] == "[6, 12]"
