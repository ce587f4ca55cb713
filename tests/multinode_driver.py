"""Two "machines" on this one: two real kernels make the same notebook_launcher(num_nodes=2) call.

Run by test_multinode.py inside a loopback-only network namespace; prints one JSON object.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time

import psutil
from kernel import Kernel

SETUP = """
%load_ext kernelside
import torch.distributed as dist
from kernelside import notebook_launcher, WorkerError, last_report
def train(fail_rank):
    import torch, torch.distributed as dist
    rank = dist.get_rank()
    print(f"hello from rank {rank} of {dist.get_world_size()}", flush=True)
    if rank == fail_rank:
        raise ValueError(f"bad shard on rank {rank}")
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    return t.item(), dist.get_world_size()
def bars(n):
    import torch.distributed as dist
    from kernelside import log_metrics, progress
    rank = dist.get_rank()
    for i in progress(range(n), desc=f"bar of rank {rank}"):
        log_metrics(step=i, loss=float(rank * 100 + i))
    dist.barrier()
    return rank
def sleeper():
    import time
    print("sleeping", flush=True)
    time.sleep(120)
"""

EVENTS = (
    "notebook_launcher(bars, args=(5,), num_processes=2, num_nodes=2, node_rank={node}, rdzv_backend='c10d', "
    "rdzv_endpoint='127.0.0.1:{port}', rdzv_id='events', config={config!r})"
)
TIMEOUT = (
    "notebook_launcher(sleeper, num_processes=2, num_nodes=2, node_rank={node}, rdzv_backend='c10d', "
    "rdzv_endpoint='127.0.0.1:{port}', rdzv_id='timeout', timeout=4)"
)
REPORT = """import json
r = last_report()
print(json.dumps({"outcome": r.outcome, "progress": r.event_counts.get("progress", 0),
                  "metric_ranks": sorted({p["rank"] for p in r.metrics}), "wall_s": r.wall_s}))
"""

CALL = (
    "notebook_launcher(train, args=({fail},), num_processes=2, num_nodes=2, node_rank={node}, "
    "rdzv_backend='c10d', rdzv_endpoint='127.0.0.1:{port}', rdzv_id='{run_id}')"
)


CELL = """%%distributed --config {config}
import torch
t = torch.tensor([float(rank)])
dist.all_reduce(t)
print(f"cell rank {{rank}} of {{world_size}} sum {{t.item()}}", flush=True)
world_size
"""

EVENTS_CONFIG = os.path.join(tempfile.gettempdir(), f"nblaunch-test-events-{os.getpid()}.yaml")

CONFIG = """num_machines: 2
machine_rank: {node}
num_processes: 4
main_process_ip: 127.0.0.1
main_process_port: {port}
rdzv_backend: c10d
"""


def both(kernels, port: int, fail: int, run_id: str, cell: bool = False, call: str = CALL) -> list[dict]:
    cells: list = [None, None]

    def one(node):
        code = call.format(fail=fail, node=node, port=port, run_id=run_id, config=EVENTS_CONFIG)
        if cell:  # the panel's multi-machine fields, read from each machine's nblaunch.yaml
            path = os.path.join(tempfile.gettempdir(), f"nblaunch-test-node{node}-{os.getpid()}.yaml")
            with open(path, "w") as fh:
                fh.write(CONFIG.format(node=node, port=port))
            code = CELL.format(config=path)
        try:
            cells[node] = kernels[node].run(code, timeout=120)
        finally:
            if cell:
                os.unlink(path)

    threads = [threading.Thread(target=one, args=(n,)) for n in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [
        {
            "stdout": c.stdout,
            "result": (c.result or {}).get("text/plain"),
            "error": [c.error["ename"], c.error["evalue"]] if c.error else None,
            "bars": _bar_descriptions(c),
            "report": json.loads(kernels[node].run(REPORT).ok().stdout),
        }
        for node, c in enumerate(cells)
    ]


def _bar_descriptions(cell) -> list[str]:
    """The descriptions of the progress-bar widgets the cell's kernel drew (from its comm messages)."""
    found = set()
    for kind, content in cell.messages:
        if kind in ("comm_open", "comm_msg"):
            state = content.get("data", {}).get("state", {})
            if state.get("_model_name") in ("FloatProgressModel", "IntProgressModel") or "bar_style" in state:
                if state.get("description"):
                    found.add(state["description"])
    return sorted(found)


def main() -> None:
    port = int(sys.argv[1])
    kernels = [Kernel(), Kernel()]
    with open(EVENTS_CONFIG, "w") as fh:
        fh.write("progress: all\n")
    try:
        for k in kernels:
            k.run(SETUP).ok()
        ok = both(kernels, port, -1, "ok")
        failed = both(kernels, port, 3, "fail")
        cell = both(kernels, port, -1, "cell", cell=True)
        events = both(kernels, port, -1, "events", call=EVENTS)
        t0 = time.monotonic()
        timeout = both(kernels, port, -1, "timeout", call=TIMEOUT)
        timeout_s = time.monotonic() - t0
        left = [[p.cmdline() for p in psutil.Process(k.pid).children(recursive=True)] for k in kernels]
    finally:
        os.unlink(EVENTS_CONFIG)
        for k in kernels:
            k.shutdown()
    print(
        json.dumps(
            {
                "ok": ok,
                "failed": failed,
                "cell": cell,
                "events": events,
                "timeout": timeout,
                "timeout_s": timeout_s,
                "left": left,
            }
        )
    )


if __name__ == "__main__":
    main()
