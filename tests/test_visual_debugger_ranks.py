"""JupyterLab's debugger panel reaches every rank: breakpoints in a ``%%distributed`` cell stop the ranks.

A real kernel's debugger is driven as JupyterLab drives it (tests/kernel_debugger.py): the switch on, then
``dumpCell`` and ``setBreakpoints`` on the cell's text as the gutter sets them, the cell run, and the panel's
requests (``threads``, ``stackTrace``, ``scopes``, ``variables``, ``continue``, ``next``, ``disconnect``) on
the threads the ``stopped`` events name. Ranks are real processes with torch.distributed (gloo)."""

from __future__ import annotations

import pytest
from kernel import Kernel
from kernel_debugger import (
    KernelDebugger,
    clear_breakpoints,
    continue_all,
    frame_variables,
    set_breakpoints,
    start,
    stopped_ranks,
)

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
        continue_all(d, ranks.values())
    k.wait(cell, 120)
    assert cell.reply["status"] == "ok", cell.outputs
    assert k.run("here").result["text/plain"] == "[0, 10]"
    assert k.children() == []


def stopped_thread_ids(d: KernelDebugger) -> set[int]:
    return set(d.request("debugInfo")["body"]["stoppedThreads"])


@pytest.mark.parametrize("start_method", ["spawn", "forkserver"])
def test_a_breakpoint_reached_by_rank_1_only_stops_rank_1_and_the_rank_runs_debugpy(debugged, start_method):
    k, d = debugged
    code = (
        f"%%distributed -n 2 --start-method {start_method} --return-from all --return seen\n"
        "import sys\n"
        "seen = ('debugpy' in sys.modules, rank)\n"
        "if rank == 1:\n"
        "    only = 'one'\n"
    )
    source = set_breakpoints(d, code, [5])
    cell = start(k, code)
    ranks = stopped_ranks(d, 1)
    try:
        assert list(ranks) == ["rank 1"]
        frame, local = frame_variables(d, ranks["rank 1"])
        assert frame["line"] == 5 and local["rank"] == "1", (frame, local)
        assert stopped_thread_ids(d) == {ranks["rank 1"]}  # rank 0 ran on past the cell
    finally:
        clear_breakpoints(d, source)
        d.request("continue", {"threadId": ranks["rank 1"]})
    k.wait(cell, 120)
    assert cell.reply["status"] == "ok", cell.outputs
    assert k.run("seen").result["text/plain"] == "[(True, 0), (True, 1)]"  # debugged: each rank's own debugpy
    assert k.children() == []


def test_next_steps_one_rank_while_the_other_stays_stopped(debugged):
    k, d = debugged
    code = (
        "%%distributed -n 2 --return-from all --return walked\n"
        "walked = rank + 100\nstep = walked * 2\ndone = step + 1\n"
    )
    source = set_breakpoints(d, code, [2])
    cell = start(k, code)
    ranks = stopped_ranks(d, 2)
    try:
        d.request("next", {"threadId": ranks["rank 0"]})
        stepped = d.wait_event("stopped", where=lambda b: b["threadId"] == ranks["rank 0"] and b["reason"] == "step")
        assert stepped["body"]["allThreadsStopped"] is False
        frame0, local0 = frame_variables(d, ranks["rank 0"])
        frame1, local1 = frame_variables(d, ranks["rank 1"])
        assert (frame0["line"], local0["walked"]) == (3, "100"), (frame0, local0)
        assert frame1["line"] == 2 and "walked" not in local1, (frame1, local1)
    finally:
        clear_breakpoints(d, source)
        continue_all(d, ranks.values())
    k.wait(cell, 120)
    assert cell.reply["status"] == "ok", cell.outputs
    assert k.run("walked").result["text/plain"] == "[100, 101]"


def test_a_peer_in_a_collective_waits_for_a_rank_stopped_longer_than_its_group_timeout(debugged):
    k, d = debugged
    code = (
        "%%distributed -n 2 --return-from all --return waited\n"
        "import datetime, time, torch.distributed as dist\n"
        "dist.init_process_group('gloo', timeout=datetime.timedelta(seconds=5))\n"
        "t0 = time.monotonic()\n"
        "if rank == 1:\n"
        "    held = True\n"
        "dist.barrier()\n"
        "waited = time.monotonic() - t0\n"
    )
    source = set_breakpoints(d, code, [6])
    cell = start(k, code)
    ranks = stopped_ranks(d, 1)
    try:
        # rank 0 is in barrier meanwhile; a person looks at rank 1 for 20 s, four times the group timeout
        with pytest.raises(TimeoutError):  # (a peer timing out would end the cell with an error first)
            k.wait(cell, 20)
    finally:
        clear_breakpoints(d, source)
        d.request("continue", {"threadId": ranks["rank 1"]})
    k.wait(cell, 120)
    assert cell.reply["status"] == "ok", cell.outputs
    waited = eval(k.run("waited").result["text/plain"])
    assert waited[0] >= 20, waited


def test_an_uncaught_exception_stops_rank_1_in_its_frame_and_continuing_lets_the_launch_fail(debugged):
    k, d = debugged
    d.request("setExceptionBreakpoints", {"filters": ["uncaught"]})
    code = "%%distributed -n 2\nvalue = rank * 7\nif rank == 1:\n    raise ValueError(f'boom {value}')\n"
    cell = start(k, code)
    try:
        ranks = stopped_ranks(d, 1)
        assert list(ranks) == ["rank 1"]
        frame, local = frame_variables(d, ranks["rank 1"])
        assert frame["line"] == 4 and local["value"] == "7", (frame, local)
        info = d.request("exceptionInfo", {"threadId": ranks["rank 1"]})
        assert "boom 7" in str(info["body"]), info
        d.request("continue", {"threadId": ranks["rank 1"]})
    finally:
        d.request("setExceptionBreakpoints", {"filters": []})
    k.wait(cell, 120)
    assert cell.error is not None and "boom 7" in cell.error["evalue"] + str(cell.outputs), cell.outputs
    assert k.children() == []


def test_the_kernels_own_plain_cell_breakpoint_still_stops_with_ranks_debugged_beside_it(debugged):
    k, d = debugged
    plain = "a = 1\nb = a + 1\nc = b * 2\n"
    source = set_breakpoints(d, plain, [2])
    cell = start(k, plain)
    stopped = d.wait_event("stopped", timeout=60)
    thread = stopped["body"]["threadId"]
    frames = d.request("stackTrace", {"threadId": thread})["body"]["stackFrames"]
    clear_breakpoints(d, source)
    d.request("continue", {"threadId": thread})
    assert frames[0]["line"] == 2 and frames[0]["source"]["path"] == source
    k.wait(cell, 60)
    assert k.run("c").result["text/plain"] == "4"


def test_switching_the_debugger_off_releases_stopped_ranks(tmp_path):
    k = Kernel(cwd=str(tmp_path))  # (its own kernel: ipykernel's debugger does not start twice in one kernel)
    try:
        d = KernelDebugger(k)
        assert d.start()["isStarted"]
        k.run("%load_ext kernelside").ok()
        code = TWO_RANKS + "here = rank\nafter = here + 1\n"
        set_breakpoints(d, code, [3])
        cell = start(k, code)
        stopped_ranks(d, 2)
        d.stop()  # the switch turned off: the ranks run on, and their breakpoints are gone
        k.wait(cell, 120)
        assert cell.reply["status"] == "ok", cell.outputs
        assert k.run("here").result["text/plain"] == "[0, 1]"
        assert k.children() == []
        k.run(code, timeout=120).ok()  # and the next launch runs undebugged
    finally:
        k.shutdown()


def test_a_live_session_stops_on_breakpoints_across_cells_with_every_ranks_state_kept(debugged):
    k, d = debugged
    first = "%%distributed\nkept = rank + 5\nnext_line = kept\n"
    second = "%%distributed --return-from all --return total\ntotal = kept * 2\nlast = total\n"
    sources = [set_breakpoints(d, first, [3]), set_breakpoints(d, second, [3])]
    k.run("%distributed_start -n 2", timeout=180).ok()
    try:
        for code, name, want in ((first, "kept", lambda r: r + 5), (second, "total", lambda r: (r + 5) * 2)):
            cell = start(k, code)
            ranks = stopped_ranks(d, 2)
            try:
                for label, thread in ranks.items():
                    frame, local = frame_variables(d, thread)
                    assert frame["line"] == 3 and local[name] == str(want(int(label.split()[1]))), (frame, local)
            finally:
                continue_all(d, ranks.values())
            k.wait(cell, 120)
            assert cell.reply["status"] == "ok", cell.outputs
        assert k.run("total").result["text/plain"] == "[10, 12]"
    finally:
        for source in sources:
            clear_breakpoints(d, source)
        k.run("%distributed_stop", timeout=120).ok()
    assert k.children() == []


def test_a_breakpoint_in_a_notebook_function_stops_the_ranks_notebook_launcher_runs(debugged):
    k, d = debugged
    define = "def train(scale):\n    local_value = scale * 3\n    return local_value\n"
    k.run(define).ok()
    source = set_breakpoints(d, define, [3])
    cell = start(k, "from kernelside import notebook_launcher\nnotebook_launcher(train, args=(2,), num_processes=2)")
    ranks = stopped_ranks(d, 2)
    try:
        for thread in ranks.values():
            frame, local = frame_variables(d, thread)
            assert (frame["name"], frame["line"], local["local_value"]) == ("train", 3, "6"), (frame, local)
    finally:
        clear_breakpoints(d, source)
        continue_all(d, ranks.values())
    k.wait(cell, 120)
    assert cell.result["text/plain"] == "6", cell.outputs


def test_interrupt_while_ranks_are_stopped_in_the_debugger_ends_the_launch_with_nothing_left(debugged):
    k, d = debugged
    code = "%%distributed -n 2\nwaiting = rank\nnever = waiting\n"
    source = set_breakpoints(d, code, [3])
    cell = start(k, code)
    try:
        stopped_ranks(d, 2)
        k.interrupt()
        k.wait(cell, 120)
    finally:
        clear_breakpoints(d, source)
    assert cell.error is not None and cell.error["ename"] == "KeyboardInterrupt", cell.outputs
    assert k.children() == []
    assert d.request("debugInfo")["body"]["stoppedThreads"] == []  # the ended ranks left the panel


def test_a_live_session_started_before_any_breakpoint_stops_once_one_is_set(debugged):
    k, d = debugged
    k.run("%distributed_start -n 2", timeout=180).ok()
    try:
        k.run("%%distributed\nbefore = rank * 3", timeout=120).ok()  # (undebugged: nothing set in the panel)
        code = "%%distributed --return-from all --return later\nlater = before + 1\nafter_later = later\n"
        source = set_breakpoints(d, code, [3])
        cell = start(k, code)
        ranks = stopped_ranks(d, 2)
        try:
            for label, thread in ranks.items():
                _, local = frame_variables(d, thread)
                assert local["later"] == str(int(label.split()[1]) * 3 + 1), local
        finally:
            clear_breakpoints(d, source)
            continue_all(d, ranks.values())
        k.wait(cell, 120)
        assert cell.reply["status"] == "ok", cell.outputs
        assert k.run("later").result["text/plain"] == "[1, 4]"
    finally:
        k.run("%distributed_stop", timeout=120).ok()
    assert k.children() == []
