"""Launches on real GPUs from a launching process without CUDA: NCCL, devices, gpu_ids, DDP, failure, report.

One GPU is enough; with more, N = the number of GPUs and the checks cover every rank.
"""

from __future__ import annotations

import os
import time

import psutil
import pytest
import torch
from gpu_facts import same_uuid, wait_gpu_released

from kernelside import LaunchConfigError, WorkerError, last_report, notebook_launcher
from kernelside.launch import cuda_guard

pytestmark = pytest.mark.usefixtures("gpu_left_clean", "no_leaks")  # NVML is up before the fd census


def rank_facts():
    import os

    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    t = torch.full((4,), float(rank + 1), device="cuda")
    dist.all_reduce(t)
    dev = torch.cuda.current_device()
    return {
        "rank": rank,
        "local_rank": int(os.environ["LOCAL_RANK"]),
        "backend": dist.get_backend(),
        "current_device": dev,
        "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "uuid": str(torch.cuda.get_device_properties(dev).uuid),
        "reduced": t,
    }


@pytest.fixture(scope="module")
def nccl_run(gpus):
    """One launch with a rank per GPU, shared by the checks below (each NCCL start costs seconds)."""
    values = notebook_launcher(rank_facts, num_processes=gpus, return_all=True)
    report = last_report()
    left = [c for c in psutil.Process().children(recursive=True) if c.status() != psutil.STATUS_ZOMBIE]
    assert not left, f"processes left behind: {left}"
    return values, report


def test_nccl_is_chosen_when_every_rank_has_a_gpu(nccl_run, gpus):
    values, report = nccl_run
    assert report.backend == "nccl" and report.world_size == gpus
    assert [v["backend"] for v in values] == ["nccl"] * gpus


def test_each_rank_computes_on_its_own_gpu(nccl_run, visible):
    values, _ = nccl_run
    for v in values:
        assert v["current_device"] == v["local_rank"] == v["rank"]
        assert same_uuid(v["uuid"], visible[v["rank"]][2]), (v["rank"], v["uuid"], visible[v["rank"]][2])
    assert len({v["uuid"] for v in values}) == len(values)


def test_cuda_visible_devices_is_the_planned_list(nccl_run, visible):
    values, _ = nccl_run
    planned = ",".join(entry for entry, _, _ in visible)
    assert {v["cvd"] for v in values} == {planned}


def test_all_reduce_of_a_cuda_tensor_is_correct(nccl_run, gpus):
    values, _ = nccl_run
    for v in values:
        assert v["reduced"].tolist() == [gpus * (gpus + 1) / 2] * 4


def test_returned_cuda_tensors_arrive_on_cpu_and_the_launcher_keeps_cuda_uninitialized(nccl_run):
    values, _ = nccl_run
    assert {v["reduced"].device.type for v in values} == {"cpu"}
    assert torch.cuda.is_initialized() is False
    assert cuda_guard.is_cuda_initialized() is False, cuda_guard.first_init_site()


def ddp_steps(steps=8):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dev = torch.device("cuda", torch.cuda.current_device())
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).to(dev)
    model = DDP(net, device_ids=[dev.index])
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator(device=dev).manual_seed(dist.get_rank())
    x = torch.randn(64, 32, device=dev, generator=g)
    y = x.sum(1, keepdim=True) * 0.1
    losses = []
    for _ in range(steps):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {"losses": losses, "weights": model.module.state_dict(), "trained_on": str(next(net.parameters()).device)}


def test_ddp_trains_on_the_gpus_and_the_weights_come_back_on_cpu_in_sync(gpus):
    values = notebook_launcher(ddp_steps, num_processes=gpus, return_all=True)
    assert [v["trained_on"] for v in values] == [f"cuda:{r}" for r in range(gpus)]
    for v in values:
        assert v["losses"][-1] < v["losses"][0], v["losses"]
        assert {t.device.type for t in v["weights"].values()} == {"cpu"}
    for v in values[1:]:
        for name, w in v["weights"].items():
            assert torch.equal(w, values[0]["weights"][name]), f"{name} differs between rank 0 and another rank"
    assert torch.cuda.is_initialized() is False


def test_more_ranks_than_gpus_share_them_through_gloo_with_one_line_saying_so(gpus, capfd):
    n = 4 if gpus < 4 else gpus + 1
    values = notebook_launcher(rank_facts, num_processes=n, return_all=True)
    out = capfd.readouterr().out
    said = [line for line in out.splitlines() if line.startswith("nblaunch: using gloo, not NCCL")]
    assert len(said) == 1, out
    assert f"{n} ranks share {gpus} GPU" in said[0]
    assert [v["backend"] for v in values] == ["gloo"] * n
    assert [v["current_device"] for v in values] == [r % gpus for r in range(n)]
    for v in values:
        assert v["reduced"].tolist() == [n * (n + 1) / 2] * 4


def test_nccl_asked_for_with_more_ranks_than_gpus_is_the_clear_error(gpus):
    with pytest.raises(LaunchConfigError, match=f"backend='nccl' needs one GPU per rank, but {gpus + 1} ranks have"):
        notebook_launcher(rank_facts, num_processes=gpus + 1, backend="nccl")


def test_gpu_ids_pick_the_devices(gpus, visible):
    last = gpus - 1
    [v] = notebook_launcher(rank_facts, num_processes=1, gpu_ids=str(last), return_all=True)
    assert v["cvd"] == visible[last][0] and v["backend"] == "nccl"
    assert same_uuid(v["uuid"], visible[last][2])
    if gpus >= 2:  # two ranks, in the order given: rank 0 on the last GPU, rank 1 on the first
        values = notebook_launcher(rank_facts, num_processes=2, gpu_ids=f"{last},0", return_all=True)
        assert values[0]["cvd"] == f"{visible[last][0]},{visible[0][0]}"
        assert same_uuid(values[0]["uuid"], visible[last][2]) and same_uuid(values[1]["uuid"], visible[0][2])


def test_a_missing_gpu_id_is_the_clear_error(gpus):
    with pytest.raises(LaunchConfigError, match=rf"GPU {gpus} is not present; this kernel sees {gpus} GPU\(s\)"):
        notebook_launcher(rank_facts, num_processes=1, gpu_ids=str(gpus))


def fail_inside_nccl_collective():
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.ones(64 * 2**20, device="cuda")  # 256 MiB on the GPU: "nothing left" means something
    dist.all_reduce(t)
    torch.cuda.synchronize()
    if rank == world - 1:
        dist.all_reduce(t, async_op=True)  # an NCCL collective in flight when the rank fails
        raise RuntimeError(f"rank {rank} fails inside an NCCL collective")
    dist.all_reduce(t)  # matched by the failing rank's last collective
    dist.all_reduce(t)  # never matched: the other ranks block here on the GPU
    torch.cuda.synchronize()


def test_a_rank_failing_inside_an_nccl_collective_returns_within_5s_and_frees_the_gpu(gpus, nvml, visible):
    handles = [h for _, h, _ in visible]
    baseline = [int(nvml.nvmlDeviceGetMemoryInfo(h).used) for h in handles]
    with pytest.raises(WorkerError) as info:
        notebook_launcher(fail_inside_nccl_collective, num_processes=gpus)
    t_return = time.monotonic()
    failed_at = last_report().root_cause().t  # the rank's own monotonic clock: the same clock on one machine
    assert t_return - failed_at < 5.0, f"returned {t_return - failed_at:.1f}s after the rank failed"
    assert info.value.rank == gpus - 1
    assert f"rank {gpus - 1} fails inside an NCCL collective" in str(info.value)
    pids = {r.pid for r in last_report().ranks}
    released, held = wait_gpu_released(nvml, handles, baseline, pids, within=5.0)
    assert released, f"{time.monotonic() - t_return:.1f}s after the call returned: {held}"


def busy_on_gpu(seconds=2.5):
    import time

    import torch

    block = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")  # 256 MiB held by this rank
    a = torch.randn(4096, 4096, device="cuda")
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        a = torch.tanh(a @ a)
        torch.cuda.synchronize()
    return block.numel()


def test_run_report_shows_each_rank_gpu_memory_and_utilization(gpus):
    n = gpus if gpus > 1 else 2  # two ranks on one GPU: the figures must stay per rank
    notebook_launcher(busy_on_gpu, num_processes=n)
    report = last_report()
    for r in report.ranks:
        assert r.gpu_index == r.rank % gpus, (r.rank, r.gpu_index)
        assert r.gpu_memory_bytes is not None and r.gpu_memory_bytes >= 256 * 2**20, (r.rank, r.gpu_memory_bytes)
        assert r.gpu_util_percent is not None and 0 < r.gpu_util_percent <= 100, (r.rank, r.gpu_util_percent)
    md = report._repr_markdown_()
    assert "| GPU | GPU memory (MiB) | GPU util (%) |" in md
    assert os.getpid() not in {r.pid for r in report.ranks}
