"""notebook_launcher() inside a real ipykernel: live output, interrupt, kernel death, leaks, spawn."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest
from kernel import Kernel

RANK_SUM = """
def rank_sum():
    import torch, torch.distributed as dist
    t = torch.ones(1) * dist.get_rank()
    dist.all_reduce(t)
    return t.item()
"""


@pytest.fixture(scope="module")
def kernel(kernel_with):
    return kernel_with(
        "from kernelside import notebook_launcher, last_report\nimport os, time, signal, threading",
        RANK_SUM,
        load_ext=False,
    )


def test_rank0_output_reaches_the_cell_while_the_run_is_still_going(kernel, tmp_path):
    gate = tmp_path / "gate"
    kernel.run(f"""
def chatty():
    import torch.distributed as dist
    print("first line from rank", dist.get_rank(), flush=True)
    while not os.path.exists({str(gate)!r}):
        time.sleep(0.01)
    print("second line")
""").ok()
    seen = []

    def on_output(kind, content):
        seen.append(content.get("text", ""))
        if "first line from rank 0" in content.get("text", ""):
            gate.touch()  # the run can only finish because the first line arrived live

    cell = kernel.run("notebook_launcher(chatty, num_processes=2)", timeout=60, on_output=on_output).ok()
    assert "first line from rank 0\n" in cell.stdout and "second line\n" in cell.stdout
    assert "first line from rank 1" not in cell.stdout


def test_interrupt_stops_every_worker_within_5s_and_the_kernel_launches_again(kernel, tmp_path):
    kernel.run(f"""
handlers_before = {{s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD)}}
def forever():
    import torch.distributed as dist
    with open(os.path.join({str(tmp_path)!r}, f"pid{{dist.get_rank()}}"), "w") as fh:
        fh.write(str(os.getpid()))
    print("running", flush=True)
    while True:
        time.sleep(0.05)
""").ok()
    sent = {}

    def on_output(kind, content):
        if "running" in content.get("text", "") and not sent:
            sent["t"] = time.monotonic()
            kernel.interrupt()

    cell = kernel.run("notebook_launcher(forever, num_processes=2)", timeout=60, on_output=on_output)
    elapsed = time.monotonic() - sent["t"]
    assert cell.error is not None and cell.error["ename"] == "KeyboardInterrupt"
    assert elapsed < 5
    pids = [int((tmp_path / f"pid{r}").read_text()) for r in range(2)]
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    after = kernel.run("""
print({s: signal.getsignal(s) for s in handlers_before} == handlers_before)
print(last_report().outcome)
print(notebook_launcher(rank_sum, num_processes=2))
""").ok()
    assert after.stdout.split() == ["True", "interrupted", "1.0"]


def test_spawn_runs_functions_and_classes_defined_in_notebook_cells(kernel):
    kernel.run("""
import torch
class Scaler(torch.nn.Module):
    def __init__(self, k):
        super().__init__()
        self.k = k
    def forward(self, x):
        return x * self.k
def use_scaler(m, x):
    import torch.distributed as dist
    out = m(x) + dist.get_rank()
    dist.all_reduce(out)
    return out
""").ok()
    cell = kernel.run(
        "print(notebook_launcher(use_scaler, args=(Scaler(3), torch.ones(2)), num_processes=2, "
        "start_method='spawn').tolist(), last_report().start_method)"
    ).ok()
    assert cell.stdout.split("]")[1].strip() == "spawn"
    assert cell.stdout.startswith("[7.0, 7.0]")


@pytest.mark.kernel  # it ends the kernel itself
def test_workers_die_when_the_kernel_process_dies(tmp_path):
    k = Kernel()
    try:
        k.run(f"""
from kernelside import notebook_launcher
import os, time
def park():
    import torch.distributed as dist
    open(os.path.join({str(tmp_path)!r}, f"pid{{dist.get_rank()}}"), "w").write(str(os.getpid()))
    dist.barrier()
    print("parked", flush=True)
    time.sleep(600)
""").ok()
        k.kc.execute("notebook_launcher(park, num_processes=2)")
        while "parked" not in k.kc.get_iopub_msg(timeout=60)["content"].get("text", ""):
            pass
        workers = [psutil.Process(int(p.read_text())) for p in tmp_path.iterdir()]
        os.kill(k.pid, signal.SIGKILL)
        gone, alive = psutil.wait_procs(workers, timeout=5)
        assert alive == [], f"workers outlived their kernel: {alive}"
    finally:
        k.shutdown()


def _interrupt_when(kernel, code: str, trigger) -> tuple[dict, float]:
    """Run ``code``; interrupt the kernel at the first output for which ``trigger(kind, content)`` holds."""
    sent = {}

    def on_output(kind, content):
        if not sent and trigger(kind, content):
            sent["t"] = time.monotonic()
            kernel.interrupt()

    cell = kernel.run(code, timeout=120, on_output=on_output)
    assert sent, f"the trigger never fired: {cell.outputs}"
    return cell.error, time.monotonic() - sent["t"]


def _assert_no_workers_left(kernel):
    pids = kernel.run("print(*[r.pid for r in last_report().ranks])").ok().stdout.split()
    assert pids
    for pid in map(int, pids):
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_interrupt_during_startup_of_spawned_workers(kernel):
    kernel.run("def quick():\n    return 1").ok()
    # the status widget appears as soon as the workers exist; spawned ones still import torch then
    error, elapsed = _interrupt_when(
        kernel,
        "notebook_launcher(quick, num_processes=2, start_method='spawn')",
        lambda kind, content: kind == "display_data",
    )
    assert error["ename"] == "KeyboardInterrupt" and elapsed < 5
    assert kernel.run("print(last_report().startup_s, last_report().outcome)").ok().stdout.split() == [
        "None",
        "interrupted",
    ]
    _assert_no_workers_left(kernel)
    assert kernel.run("print(notebook_launcher(quick, num_processes=2))").ok().stdout == "1\n"


def test_interrupt_during_result_transfer(kernel):
    kernel.run("""
def big_result():
    import torch
    value = torch.ones(256 * 1024 * 1024 // 4)
    print("returning", flush=True)
    return [value, value.clone(), value.clone()]
""").ok()
    error, elapsed = _interrupt_when(
        kernel,
        "notebook_launcher(big_result, num_processes=2)",
        lambda kind, content: "returning" in content.get("text", ""),
    )
    assert error["ename"] == "KeyboardInterrupt" and elapsed < 5
    _assert_no_workers_left(kernel)
    assert kernel.run("print(notebook_launcher(rank_sum, num_processes=2))").ok().stdout == "1.0\n"


def test_soak_hundred_launches_in_a_row_hold_fds_threads_children_and_rss_steady(kernel):
    cell = kernel.run(
        """
import json, psutil
def nothing():
    return 0
notebook_launcher(nothing, num_processes=2)
from kernelside.engines import forkserver
def figures():
    me = psutil.Process()
    template = getattr(forkserver.running_template(), "pid", None)  # a GPU machine's, started with kernelside
    return {"fds": len(os.listdir("/proc/self/fd")), "threads": me.num_threads(),
            "children": len([c for c in me.children(recursive=True) if c.pid != template]),
            "rss_mb": me.memory_info().rss / 2**20}
before = figures()
for _ in range(100):
    notebook_launcher(nothing, num_processes=2)
print(json.dumps({"before": before, "after": figures()}))
""",
        timeout=300,
    ).ok()
    import json

    fig = json.loads(cell.stdout.strip().splitlines()[-1])
    print("soak, 100 launches:", fig)  # shown with pytest -s; the figures are in the closing note
    before, after = fig["before"], fig["after"]
    assert (after["fds"], after["threads"], after["children"]) == (before["fds"], before["threads"], 0)
    assert after["rss_mb"] - before["rss_mb"] < 40, fig
