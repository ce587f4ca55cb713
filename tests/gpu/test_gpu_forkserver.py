"""The forkserver on a GPU: a real kernel with CUDA initialized launches NCCL ranks forked from the template.

The kernel initializes CUDA with a tensor on cuda, as most notebooks do before launching; ``auto`` must then
pick the forkserver (never fork, never the slower spawn), the ranks must be the template's children with
no CUDA context inherited, compute on their own GPUs, and a live session started now must use it too.
Everything (template, ranks, GPU memory) is gone after the kernel's shutdown.
"""

from __future__ import annotations

import json
import re
import time

import psutil
import pytest
from kernel import Kernel

pytestmark = pytest.mark.usefixtures("gpu_left_clean")

RANK_FACTS = """
def rank_facts():
    import os, torch, torch.distributed as dist
    inherited = torch.cuda.is_initialized()  # before this rank touches CUDA: nothing came from the kernel
    t = torch.ones(1, device="cuda")
    dist.all_reduce(t)
    return {"pid": os.getpid(), "ppid": os.getppid(), "inherited": inherited, "backend": dist.get_backend(),
            "device": torch.cuda.current_device(), "sum": t.item()}
"""


@pytest.mark.kernel
def test_a_kernel_with_cuda_up_launches_through_the_forkserver_and_leaves_nothing(gpus):
    k = Kernel()
    pids: list[int] = []
    try:
        k.run(
            "%load_ext kernelside\nimport json, os, time, torch\n"
            "from kernelside import notebook_launcher, last_report\nfrom kernelside.engines import forkserver\n"
            "x = torch.ones(1, device='cuda')  # CUDA is up in the kernel\n" + RANK_FACTS,
            timeout=180,
        ).ok()
        cell = k.run(
            f"got = notebook_launcher(rank_facts, num_processes={gpus}, return_all=True)\n"
            "print(json.dumps({'got': got, 'method': last_report().start_method,"
            " 'template': forkserver.running_template().pid}))",
            timeout=300,
        ).ok()
        assert "nblaunch: using the forkserver, not fork, because CUDA was initialized in this kernel" in cell.stdout
        facts = json.loads(cell.stdout.strip().splitlines()[-1])
        assert facts["method"] == "forkserver"
        got = facts["got"]
        assert [g["ppid"] for g in got] == [facts["template"]] * gpus
        assert not any(g["inherited"] for g in got)
        # CUDA_VISIBLE_DEVICES lists the launch's GPUs, so rank r computes on cuda:r (LaunchPlan.device_for)
        assert [g["device"] for g in got] == list(range(gpus)) and {g["backend"] for g in got} == {"nccl"}
        assert [g["sum"] for g in got] == [float(gpus)] * gpus
        t0 = time.monotonic()
        k.run(f"notebook_launcher(rank_facts, num_processes={gpus})", timeout=120).ok()
        second = time.monotonic() - t0
        print(f"second forkserver launch on {gpus} GPU(s): {second:.2f} s")  # shown with -s, for the note

        k.run(f"%distributed_start -n {gpus}", timeout=300).ok()
        status = k.run("%distributed_status").ok().stdout
        assert f"{gpus} ranks, nccl, forkserver" in status, status
        live_pids = [int(p) for p in re.findall(r"rank \d+: pid (\d+)", status)]
        assert len(live_pids) == gpus, status
        cell = k.run(
            "%%distributed\nt = torch.ones(1, device='cuda')\ntorch.distributed.all_reduce(t)\n"
            "(t.item(), os.getppid())",
            timeout=120,
        ).ok()
        value, ppid = eval(cell.result["text/plain"])
        assert value == float(gpus) and ppid == facts["template"]
        pids = [g["pid"] for g in got] + [facts["template"]] + live_pids
    finally:
        k.shutdown()
    assert pids and _still_running(pids, within=10.0) == []


def _still_running(pids: list[int], within: float) -> list[int]:
    """Those of ``pids`` still running (not ended, not a zombie) after waiting up to ``within`` seconds."""
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue  # already gone
    _, alive = psutil.wait_procs(procs, timeout=within)
    running = []
    for p in alive:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                running.append(p.pid)
        except psutil.NoSuchProcess:
            continue
    return running
