"""The debugger panel's requests on a rank beyond stepping: the rich view of a variable, "Copy Variable to
Globals", pause (one rank, or every rank), and ``breakpoint()`` in a rank.

A real kernel's debugger is driven as JupyterLab drives it (tests/kernel_debugger.py); the requests are the
ones JupyterLab's debugger service sends (``richInspectVariables`` with the variable's name and the selected
frame, ``copyToGlobals`` with the top frame as ``srcFrameId``, ``pause`` with the stopped thread or thread 1
when none is stopped). Ranks are real processes with torch.distributed (gloo)."""

from __future__ import annotations

import pytest
from kernel import Kernel
from kernel_debugger import KernelDebugger, clear_breakpoints, continue_all, set_breakpoints, start, stopped_ranks

pytestmark = pytest.mark.kernel  # starts kernels


@pytest.fixture(scope="module")
def debugged(tmp_path_factory):
    k = Kernel(cwd=str(tmp_path_factory.mktemp("visual_debugger_panel")))
    d = KernelDebugger(k)
    assert d.start()["isStarted"]
    k.run("%load_ext kernelside").ok()
    yield k, d
    d.stop()
    k.shutdown()


def top_frame(d: KernelDebugger, thread: int) -> dict:
    return d.request("stackTrace", {"threadId": thread})["body"]["stackFrames"][0]


def test_a_ranks_variable_shows_with_the_ranks_display_formatter_and_copies_to_the_notebooks_globals(debugged):
    k, d = debugged
    code = (
        "%%distributed -n 2\n"
        "import torch\n"
        "class Shown:\n"
        "    def _repr_html_(self):\n"
        "        return f'<b>rank {self.r}</b>'\n"
        "shown = Shown()\n"
        "shown.r = rank\n"
        "weights = {'rank': rank, 'w': torch.ones(2) * rank}\n"
        "after = 1\n"
    )
    source = set_breakpoints(d, code, [9])
    cell = start(k, code)
    ranks = stopped_ranks(d, 2)
    try:
        for label, thread in ranks.items():
            frame = top_frame(d, thread)
            rich = d.request("richInspectVariables", {"variableName": "shown", "frameId": frame["id"]})
            assert rich["success"], rich
            assert rich["body"]["data"]["text/html"] == f"<b>{label}</b>", rich  # the class's own _repr_html_
            assert rich["body"]["data"]["text/plain"].startswith("<__main__.Shown at 0x"), rich  # IPython's pretty
            plain = d.request("richInspectVariables", {"variableName": "weights", "frameId": frame["id"]})
            assert plain["body"]["data"]["text/plain"].startswith("{'rank': " + label[-1]), plain
        frame = top_frame(d, ranks["rank 1"])
        copied = d.request(
            "copyToGlobals", {"srcVariableName": "weights", "dstVariableName": "from_rank_1", "srcFrameId": frame["id"]}
        )
        assert copied["success"], copied
        # as ipykernel: the panel reads the frame's scopes again and finds the copy in the rank's globals
        scopes = d.request("scopes", {"frameId": frame["id"]})["body"]["scopes"]
        names = {
            v["name"]
            for s in scopes
            for v in d.request("variables", {"variablesReference": s["variablesReference"]})["body"]["variables"]
        }
        assert "from_rank_1" in names, names
    finally:
        clear_breakpoints(d, source)
        continue_all(d, ranks.values())
    k.wait(cell, 120)
    assert cell.reply["status"] == "ok", cell.outputs
    # and in the notebook's own globals: rank 1's value, its tensor on CPU
    got = k.run("from_rank_1['rank'], from_rank_1['w'].tolist(), from_rank_1['w'].device.type").result
    assert got["text/plain"] == "(1, [1.0, 1.0], 'cpu')"
    assert k.children() == []


def stopped_thread_ids(d: KernelDebugger) -> set[int]:
    return set(d.request("debugInfo")["body"]["stoppedThreads"])


def test_pause_stops_the_rank_its_thread_names_and_every_rank_when_it_names_none(debugged):
    k, d = debugged
    code = (
        "%%distributed -n 2 --return-from all --return spins\n"
        "import time\n"
        "spins = 0\n"
        "go_on = True\n"
        "while go_on:\n"
        "    spins += 1\n"
        "    time.sleep(0.01)\n"
        "never = 1\n"
    )
    # both ranks stopped in the loop once, then running on in it: what the panel pauses is the user's code
    source = set_breakpoints(d, code, [6])
    cell = start(k, code)
    ranks = stopped_ranks(d, 2)
    set_breakpoints(d, code, [8])  # (still something set in the panel, never reached)
    continue_all(d, ranks.values())
    try:
        assert d.request("pause", {"threadId": ranks["rank 1"]})["success"]
        paused = d.wait_event("stopped", where=lambda b: b["threadId"] == ranks["rank 1"])
        assert paused["body"]["reason"] == "pause"
        assert stopped_thread_ids(d) == {ranks["rank 1"]}  # rank 0 spins on
        # the panel's pause with no thread of a rank (JupyterLab's thread 1 when none is stopped): every rank
        assert d.request("pause", {"threadId": 1})["success"]
        d.wait_event("stopped", where=lambda b: b["threadId"] == ranks["rank 0"] and b["reason"] == "pause")
        assert stopped_thread_ids(d) == set(ranks.values())  # the kernel's own threads run on: it serves the cell
        for thread in ranks.values():
            frame = top_frame(d, thread)
            assert frame["source"]["path"] == source and frame["line"] in (5, 6, 7), frame
            said = d.request("evaluate", {"expression": "go_on = False", "frameId": frame["id"], "context": "repl"})
            assert said["success"], said
    finally:
        clear_breakpoints(d, source)
        continue_all(d, ranks.values())
    k.wait(cell, 120)
    assert cell.reply["status"] == "ok", cell.outputs
    spins = eval(k.run("spins").result["text/plain"])
    assert len(spins) == 2 and min(spins) > 0, spins
    assert k.children() == []


BREAKPOINT_CELL = (
    "%%distributed -n 2 --return-from all --return after\nvalue = rank * 3\nbreakpoint()\nafter = value + 1\n"
)


def test_breakpoint_in_a_rank_stops_in_the_panel_as_in_a_plain_cell_with_nothing_set_there(debugged):
    k, d = debugged
    plain = start(k, "seen = 1\nbreakpoint()\nthen = seen + 1\n")  # the kernel's own: where a plain cell stops
    stopped = d.wait_event("stopped", timeout=60)
    plain_line = top_frame(d, stopped["body"]["threadId"])["line"]
    d.request("continue", {"threadId": stopped["body"]["threadId"]})
    k.wait(plain, 60)
    assert plain_line == 3 and plain.reply["status"] == "ok", plain.outputs
    cell = start(k, BREAKPOINT_CELL)  # no breakpoint set in the panel: breakpoint() alone stops the ranks
    ranks = stopped_ranks(d, 2)
    try:
        for label, thread in ranks.items():
            frame = top_frame(d, thread)
            assert (frame["name"], frame["line"]) == ("<module>", 4), frame  # the line after it, as the plain cell
            scopes = d.request("scopes", {"frameId": frame["id"]})["body"]["scopes"]
            local = {
                v["name"]: v["value"]
                for v in d.request("variables", {"variablesReference": scopes[0]["variablesReference"]})["body"][
                    "variables"
                ]
            }
            assert local["value"] == str(3 * int(label[-1])), local
    finally:
        continue_all(d, ranks.values())
    k.wait(cell, 120)
    assert cell.reply["status"] == "ok", cell.outputs
    assert "(Pdb)" not in cell.stdout  # no pdb prompt meanwhile: the stop was the panel's
    assert k.run("after").result["text/plain"] == "[1, 4]"


def test_breakpoint_in_a_rank_is_pdb_through_stdin_once_the_debugger_is_switched_off(tmp_path):
    k = Kernel(cwd=str(tmp_path))  # (its own kernel: ipykernel's debugger does not start twice in one kernel)
    try:
        d = KernelDebugger(k)
        assert d.start()["isStarted"]
        k.run("%load_ext kernelside").ok()
        cell = start(k, BREAKPOINT_CELL)
        continue_all(d, stopped_ranks(d, 2).values())
        k.wait(cell, 120)
        assert cell.reply["status"] == "ok", cell.outputs
        d.stop()
        prompts = []

        def answer(prompt, password):
            prompts.append(prompt)
            return "c"

        k.run(BREAKPOINT_CELL, timeout=120, on_input=answer).ok()
        assert sorted(prompts) == ["(rank 0) (Pdb) ", "(rank 1) (Pdb) "], prompts
        assert k.run("after").result["text/plain"] == "[1, 4]"
        assert k.children() == []
    finally:
        k.shutdown()
