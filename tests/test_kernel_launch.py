"""notebook_launcher() inside a real ipykernel: live output, interrupt, kernel death, leaks, spawn."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest
from kernel import Kernel


@pytest.fixture(scope="module")
def kernel():
    k = Kernel()
    k.run("from kernelside import notebook_launcher, last_report\nimport os, time, signal, threading").ok()
    yield k
    k.shutdown()


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
def rank_sum():
    import torch, torch.distributed as dist
    t = torch.ones(1) * dist.get_rank()
    dist.all_reduce(t)
    return t.item()
print(notebook_launcher(rank_sum, num_processes=2))
""").ok()
    assert after.stdout.split() == ["True", "interrupted", "1.0"]


def test_twenty_launches_leave_fds_threads_and_children_unchanged(kernel):
    cell = kernel.run(
        """
import psutil
def nothing():
    return 0
notebook_launcher(nothing, num_processes=2)
def counts():
    me = psutil.Process()
    return len(os.listdir("/proc/self/fd")), me.num_threads(), len(me.children(recursive=True))
before = counts()
for _ in range(20):
    notebook_launcher(nothing, num_processes=2)
print(before, counts())
""",
        timeout=180,
    ).ok()
    before, after = cell.stdout.strip().split(") (")
    assert before + ")" == "(" + after, cell.stdout


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
