"""A real kernel with live ranks on a local Ray cluster that holds this machine's GPUs (``use_gpu: true``, NCCL).

Run by test_gpu_ray_live.py inside a loopback-only network namespace (tests/netns.py): a ``ray.cluster_utils.Cluster``
of one node with ``num_gpus`` GPUs and as many CPUs, a kernel whose ``nblaunch.yaml`` says ``engine: ray``,
``use_gpu: true`` and the cluster's address, ``%distributed_start -n N --engine ray`` (one rank per GPU: NCCL refuses
two ranks on one device), then what each rank saw of its GPU, an NCCL all_reduce and a DDP step, then
``%distributed_stop`` and what Ray (its GCS: actors, placement groups), /proc and NVML still hold of the ranks. Prints
one JSON object.

    python tests/gpu/ray_live_gpu_driver.py N_GPUS
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tests/: kernel.py, ray_live_driver.py

import pynvml  # noqa: E402
import ray  # noqa: E402
from gpu_facts import used_bytes, wait_gpu_released  # noqa: E402
from kernel import Kernel  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402
from ray_live_driver import STATUS, shown, timed, wait_nothing_left  # noqa: E402

# what each rank sees of its GPU once nblaunch set it up, and an NCCL all_reduce over every rank
FACTS_CELL = """%%distributed --return-from all --return facts
import os, ray, torch
import torch.distributed as dist
t = torch.full((1,), float(rank + 1), device="cuda")
dist.all_reduce(t)
facts = {
    "rank": rank,
    "local_rank": int(os.environ["LOCAL_RANK"]),
    "current_device": torch.cuda.current_device(),
    "device": str(device),
    "noset": os.environ.get("RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"),
    "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "device_count": torch.cuda.device_count(),
    "ray_gpu_ids": [str(g) for g in ray.get_gpu_ids()],
    "backend": dist.get_backend(),
    "sum": t.item(),
    "sum_device": str(t.device),
}
"""

# one DDP step on the GPUs; every rank's gradient gathered (NCCL) and compared
DDP_CELL = """%%distributed --return-from all --return in_sync
from torch.nn.parallel import DistributedDataParallel as DDP
torch.manual_seed(rank)
model = DDP(torch.nn.Linear(4, 2).cuda(), device_ids=[torch.cuda.current_device()])
model(torch.randn(8, 4, device="cuda") * (rank + 1)).sum().backward()
g = model.module.weight.grad.clone()
gs = [torch.zeros_like(g) for _ in range(world_size)]
dist.all_gather(gs, g)
in_sync = all(torch.equal(gs[0], h) for h in gs)
"""


def main(gpus: int) -> None:
    n = min(gpus, 4)
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": n, "num_gpus": gpus, "include_dashboard": False}
    )
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)  # this driver reads Ray's state (the GCS)
    folder = tempfile.mkdtemp(prefix="nblaunch-ray-gpu-")
    with open(os.path.join(folder, "nblaunch.yaml"), "w") as fh:
        fh.write(f"engine: ray\nray_address: '{cluster.address}'\nuse_gpu: true\n")
    out: dict = {"n": n, "kernel_cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    pynvml.nvmlInit()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    baseline = used_bytes(pynvml, handles)
    pids: list[int] = []
    k = Kernel(cwd=folder)
    try:
        k.run("%load_ext kernelside\nimport json", timeout=120).ok()
        out["start"] = timed(k, f"%distributed_start -n {n} --engine ray")
        out["ranks"] = json.loads(k.run(STATUS).ok().stdout)
        pids = [r["pid"] for r in out["ranks"]]
        out["facts_cell"] = timed(k, FACTS_CELL)
        out["facts"] = json.loads(k.run("print(json.dumps(facts))").ok().stdout)
        out["ddp_cell"] = timed(k, DDP_CELL)
        out["in_sync"] = shown(k.run("print(in_sync)"))["stdout"]
        out["stop"] = timed(k, "%distributed_stop")
        out["stop_left"] = wait_nothing_left(pids, timeout=30)
        out["gpu_released"] = wait_gpu_released(pynvml, handles, baseline, set(pids), within=15.0)
    except Exception as e:  # what ran so far, with the failure: the test says which step broke
        out["crash"] = f"{type(e).__name__}: {e}"
    finally:
        k.shutdown()
    out["kernel_end_left"] = wait_nothing_left(pids, timeout=30)
    ray.shutdown()
    cluster.shutdown()
    print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1])))
