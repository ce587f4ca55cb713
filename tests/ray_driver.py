"""A real kernel that runs %%distributed cells and notebook_launcher() on Ray (engine: ray).

Run by test_ray_engine.py inside a loopback-only network namespace. The kernel starts a Ray
head on 127.0.0.1 (2 CPUs, no dashboard) at its first launch and stops it with ray.shutdown()
at the end; the driver prints one JSON object with what each cell showed.
"""

from __future__ import annotations

import json
import sys
import time

import psutil
from kernel import Kernel

SETUP = """
%load_ext kernelside
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from kernelside import notebook_launcher, progress, log_metrics

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)
    def forward(self, x):
        return self.lin(x)

torch.manual_seed(0)
data = torch.randn(64, 4), torch.randn(64, 1)
"""

DDP_CELL = """%%distributed -n 2 --engine ray --return model,losses
torch.manual_seed(0)
model = DDP(Net())
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = data[0][rank::world_size], data[1][rank::world_size]
losses = []
for step in progress(range(8), desc="train"):
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
    losses.append(loss.item())
    log_metrics(step=step, loss=loss.item())
print(f"rank {rank} of {world_size} on {device}", flush=True)
world_size
"""

CHECK = "print(type(model).__name__, len(losses), kernelside_report().outcome)"

FOREVER_CELL = """%%distributed -n 2 --engine ray
import time
print("running", rank, flush=True)
while True:
    time.sleep(0.05)
"""

FAIL_FUNCTION = """
def shard(scale):
    print("before the error", dist.get_rank(), flush=True)
    if dist.get_rank() == 1:
        raise ValueError("broken shard on rank 1")
    dist.barrier()
    return scale
notebook_launcher(shard, args=(10,), num_processes=2, engine="ray")
"""


def shown(cell) -> dict:
    widgets = [c for k, c in cell.outputs if k == "display_data"]
    return {
        "stdout": cell.stdout,
        "stderr": cell.stderr,
        "result": (cell.result or {}).get("text/plain"),
        "error": [cell.error["ename"], cell.error["evalue"]] if cell.error else None,
        "widgets": len(widgets),
    }


def main() -> None:
    k = Kernel()
    try:
        k.run(SETUP).ok()
        k.run("from kernelside import last_report as kernelside_report").ok()
        interrupted_at = []

        def interrupt_once_running(kind, content):
            if "running 0" in content.get("text", "") and not interrupted_at:
                interrupted_at.append(time.monotonic())
                k.interrupt()

        out = {"interrupt": shown(k.run(FOREVER_CELL, timeout=240, on_output=interrupt_once_running))}
        out["interrupt"]["stop_s"] = time.monotonic() - interrupted_at[0] if interrupted_at else None
        out["ddp"] = shown(k.run(DDP_CELL, timeout=240))  # the cluster is free again after the interrupt
        out["check"] = shown(k.run(CHECK))
        out["metrics"] = shown(k.run("print(len(kernelside_report().metrics), kernelside_report().event_counts)"))
        out["fail"] = shown(k.run(FAIL_FUNCTION, timeout=240))
        k.run("import ray; ray.shutdown()").ok()
        # a process ray.shutdown() just ended may still be waiting for its parent to reap it: give that 10 s
        _, alive = psutil.wait_procs(psutil.Process(k.pid).children(recursive=True), timeout=10)
        out["left"] = [d for d in map(_described, alive) if d is not None]
    finally:
        k.shutdown()
    print(json.dumps(out))


def _described(proc: psutil.Process) -> list | None:
    try:
        return proc.cmdline()[:2]
    except psutil.ZombieProcess:
        return ["<zombie never reaped>", proc.pid]
    except psutil.NoSuchProcess:
        return None  # gone since


if __name__ == "__main__":
    sys.exit(main())
