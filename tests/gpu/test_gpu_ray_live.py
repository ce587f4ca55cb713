"""Live ranks on a Ray cluster with GPUs (issue 31): ``%distributed_start --engine ray`` with ``use_gpu: true``.

ray_live_gpu_driver.py starts a local ``ray.cluster_utils.Cluster`` of one node holding this machine's GPUs (in a
loopback-only network namespace, as tests/test_ray_live.py runs its cluster), a kernel whose nblaunch.yaml points at
it, one live rank per GPU (at most 4; NCCL refuses two ranks on one device, so one H200 gives one rank), and looks at
what each rank saw. What this shows on one GPU: the rank's device was set (``torch.cuda.set_device``) to the GPU Ray
gave it before its process group was made; Ray's per-actor ``CUDA_VISIBLE_DEVICES`` masking was off
(``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES`` in the rank's environment, ``CUDA_VISIBLE_DEVICES`` left as the kernel
has it, every GPU of the node seen); an NCCL all_reduce and a DDP step on the GPU; ``%distributed_stop`` leaving no
actor, placement group, process or GPU memory (NVML, in the driver), and the test process without CUDA
(``gpu_left_clean``). With two GPUs or more the same test covers
several ranks on one node, each on its own device. Without ray installed it is skipped, said as such (a skip is not
a pass): ``make gpu-wheels`` carries ray to the GPU machine.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
NO_RAY = "ray is not installed for this python: the GPU kit's Ray test needs it (make gpu-wheels carries it)"
NOTHING_LEFT = {"actors": 0, "placement_groups": 0, "processes": []}

pytestmark = [pytest.mark.usefixtures("gpu_left_clean"), pytest.mark.kernel]


@pytest.fixture(scope="module")
def shown(gpus):
    if importlib.util.find_spec("ray") is None:
        pytest.skip(NO_RAY)
    from netns import run_isolated

    driver = [sys.executable, os.path.join(HERE, "ray_live_gpu_driver.py"), str(gpus)]
    # (PYTHONPATH: the cluster's Ray workers import this checkout's kernelside and the kit's wheels, as the kernel)
    path = os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)
    # (NCCL_SOCKET_IFNAME: NCCL's bootstrap, like gloo's, on the namespace's only interface, which NCCL takes last)
    proc = run_isolated(driver, timeout=110, env={"PYTHONPATH": path, "NCCL_SOCKET_IFNAME": "lo"})
    assert proc.returncode == 0, proc.stderr[-6000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "crash" not in out, (out["crash"], {k: v for k, v in out.items() if k != "crash"})
    return out


def test_ray_gpu_ranks_each_set_their_own_device_see_every_gpu_and_all_reduce_over_nccl(shown, gpus):
    n = shown["n"]
    assert shown["start"]["error"] is None, shown["start"]
    assert f"{n} ranks on 1 Ray node(s), nccl" in shown["start"]["stdout"], shown["start"]
    assert shown["facts_cell"]["error"] is None, shown["facts_cell"]
    facts = shown["facts"]
    assert [f["rank"] for f in facts] == list(range(n)) and [f["local_rank"] for f in facts] == list(range(n))
    for f in facts:
        gpu = f["ray_gpu_ids"]
        assert len(gpu) == 1, f  # its bundle's one GPU
        # Ray's masking off: the switch in the rank's environment, CUDA_VISIBLE_DEVICES as the kernel has it (Ray
        # masking would make it the rank's one GPU), every GPU of the node seen
        assert f["noset"] == "1", f
        assert f["cuda_visible_devices"] == shown["kernel_cuda_visible_devices"], f
        assert f["device_count"] == gpus, f
        # its own GPU, set before the process group was made: the one Ray gave it, by index among those seen
        seen = (shown["kernel_cuda_visible_devices"] or ",".join(map(str, range(gpus)))).split(",")
        assert f["current_device"] == seen.index(gpu[0]), f
        assert f["device"] == f"cuda:{f['current_device']}", f
        if n == gpus:  # the ranks hold the node's GPUs in order: rank i on cuda:i
            assert f["current_device"] == f["local_rank"], f
        assert f["backend"] == "nccl" and f["sum_device"] == f"cuda:{f['current_device']}", f
        assert f["sum"] == n * (n + 1) / 2, f  # the all_reduce over every rank, on the GPUs
    assert len({f["current_device"] for f in facts}) == n  # no two ranks on one device


def test_a_ddp_step_on_ray_gpu_ranks_is_in_sync(shown):
    assert shown["ddp_cell"]["error"] is None, shown["ddp_cell"]
    assert shown["in_sync"] == str([True] * shown["n"]) + "\n"


def test_stopping_the_ray_gpu_session_leaves_no_actor_placement_group_or_process(shown):
    assert shown["stop"]["error"] is None, shown["stop"]
    assert shown["stop_left"] == NOTHING_LEFT
    released, held = shown["gpu_released"]
    assert released, held  # no rank's pid on a GPU, every GPU's memory back to what it was before the start
    assert shown["kernel_end_left"] == NOTHING_LEFT
