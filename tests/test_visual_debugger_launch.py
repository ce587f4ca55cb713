"""JupyterLab's debugger switched on never changes whether a launch runs and ends.

A real kernel's debugger is driven as JupyterLab drives it (tests/kernel_debugger.py: ``initialize``,
``attach``, ``configurationDone`` on the control channel) before ``%load_ext kernelside``, as a user who
turned the switch on first would have it. Then one-shot cells under each start method,
``notebook_launcher`` and a live cell end as they do with it off, ■ ends a launch with nothing left,
ranks run without the kernel's tracer, and a plain cell's breakpoint still stops the kernel. A second
kernel, debugger never on, shows that a rank then imports nothing of debugpy."""

from __future__ import annotations

import time

import pytest
from kernel import Cell, Kernel
from kernel_debugger import KernelDebugger

pytestmark = pytest.mark.kernel  # starts kernels

# what a rank says about the kernel's debugger: its trace function and whether pydevd is loaded in it
TRACE_REPORT = "import sys\nreport = (sys.gettrace() is None, 'pydevd' in sys.modules, 'debugpy' in sys.modules)"
EVERY_RANK = "--return report --return-from all"  # (the notebook's ``report`` then lists every rank's)


@pytest.fixture(scope="module")
def debugged(tmp_path_factory):
    k = Kernel(cwd=str(tmp_path_factory.mktemp("visual_debugger")))
    d = KernelDebugger(k)
    info = d.start()
    assert info["isStarted"], info
    k.run("%load_ext kernelside").ok()
    yield k, d
    d.stop()
    k.shutdown()


@pytest.mark.parametrize("start_method", ["fork", "forkserver", "spawn"])
def test_a_one_shot_cell_runs_and_ends_with_the_debugger_on(debugged, start_method):
    k, _ = debugged
    cell = k.run(
        f"%%distributed -n 2 --start-method {start_method} {EVERY_RANK}\n"
        "print(f'rank {rank} of {world_size}', flush=True)\n" + TRACE_REPORT,
        timeout=180,
    ).ok()
    assert "rank 0 of 2" in cell.stdout
    # every rank untraced; a spawned (or template-forked) rank loads no pydevd at all
    pydevd_loaded = start_method == "fork"
    assert k.run("report").result["text/plain"] == repr([(True, pydevd_loaded, pydevd_loaded)] * 2)
    assert k.children() == []


def test_notebook_launcher_runs_and_ends_with_the_debugger_on(debugged):
    k, _ = debugged
    k.run(
        "from kernelside import notebook_launcher\n"
        "def train(scale):\n"
        "    import torch, torch.distributed as dist\n"
        "    t = torch.ones(1) * scale\n"
        "    dist.all_reduce(t)\n"
        "    return t.item()\n"
    ).ok()
    cell = k.run("notebook_launcher(train, args=(3.0,), num_processes=2)", timeout=180).ok()
    assert cell.result["text/plain"] == "6.0"
    assert k.children() == []


def test_a_live_session_runs_cells_and_stops_with_the_debugger_on(debugged):
    k, _ = debugged
    k.run("%distributed_start -n 2", timeout=180).ok()
    try:
        k.run("%%distributed\nx = 10 * (rank + 1)", timeout=120).ok()
        k.run("%%distributed --return y --return-from all\ny = x + 1", timeout=120).ok()
        assert k.run("y").result["text/plain"] == "[11, 21]"
        k.run(f"%%distributed {EVERY_RANK}\n" + TRACE_REPORT, timeout=120).ok()
        assert k.run("report").result["text/plain"] == repr([(True, True, True)] * 2)  # (live ranks are forked)
    finally:
        k.run("%distributed_stop", timeout=120).ok()
    assert k.children() == []


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_interrupt_ends_a_launch_with_the_debugger_on_and_nothing_is_left(debugged, start_method):
    k, _ = debugged
    sent = {}

    def on_output(kind, content):
        if "asleep" in content.get("text", "") and not sent:
            sent["t"] = time.monotonic()
            k.interrupt()

    cell = k.run(
        f"%%distributed -n 2 --start-method {start_method}\nimport time\nprint('asleep', flush=True)\ntime.sleep(600)",
        timeout=240,
        on_output=on_output,
    )
    assert sent, f"rank 0 never said it was asleep: {cell.outputs}"
    assert cell.error is not None and cell.error["ename"] == "KeyboardInterrupt", cell.outputs
    assert time.monotonic() - sent["t"] < 60
    assert k.children() == []
    k.run("%%distributed -n 2\nrank", timeout=180).ok()  # and the kernel launches again


def test_a_plain_cell_breakpoint_still_stops_the_kernel(debugged):
    k, d = debugged
    code = "a = 1\nb = a + 1\nc = b * 2\n"
    source = d.request("dumpCell", {"code": code})["body"]["sourcePath"]
    reply = d.request("setBreakpoints", {"source": {"path": source}, "breakpoints": [{"line": 2}]})
    assert reply["body"]["breakpoints"][0]["verified"], reply
    cell = Cell()
    cell.msg_id = k.kc.execute(code)
    stopped = d.wait_event("stopped", timeout=60)
    thread = stopped["body"]["threadId"]
    frames = d.request("stackTrace", {"threadId": thread})["body"]["stackFrames"]
    d.request("setBreakpoints", {"source": {"path": source}, "breakpoints": []})
    d.request("continue", {"threadId": thread})
    assert frames[0]["line"] == 2 and frames[0]["source"]["path"] == source
    k.wait(cell, 60)
    assert cell.reply["status"] == "ok"
    assert k.run("c", timeout=30).result["text/plain"] == "4"


def test_with_the_debugger_off_a_spawned_rank_imports_nothing_of_debugpy(tmp_path):
    k = Kernel(cwd=str(tmp_path))
    try:
        k.run("%load_ext kernelside").ok()
        k.run(f"%%distributed -n 2 --start-method spawn {EVERY_RANK}\n" + TRACE_REPORT, timeout=180).ok()
        assert k.run("report").result["text/plain"] == repr([(True, False, False)] * 2)
        # a forked rank has what the kernel had (ipykernel imports debugpy), but no tracer
        k.run(f"%%distributed -n 2 --start-method fork {EVERY_RANK}\n" + TRACE_REPORT, timeout=180).ok()
        assert k.run("report").result["text/plain"] == repr([(True, True, True)] * 2)
    finally:
        k.shutdown()
