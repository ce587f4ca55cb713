"""Two "machines" on this one: two real kernels make the same notebook_launcher(num_nodes=2) call.

Run by test_multinode.py inside a loopback-only network namespace; prints one JSON object.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading

from kernel import Kernel

SETUP = """
%load_ext kernelside
import torch.distributed as dist
from kernelside import notebook_launcher, WorkerError
def train(fail_rank):
    import torch, torch.distributed as dist
    rank = dist.get_rank()
    print(f"hello from rank {rank} of {dist.get_world_size()}", flush=True)
    if rank == fail_rank:
        raise ValueError(f"bad shard on rank {rank}")
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    return t.item(), dist.get_world_size()
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

CONFIG = """num_machines: 2
machine_rank: {node}
num_processes: 4
main_process_ip: 127.0.0.1
main_process_port: {port}
rdzv_backend: c10d
"""


def both(kernels, port: int, fail: int, run_id: str, cell: bool = False) -> list[dict]:
    cells: list = [None, None]

    def one(node):
        code = CALL.format(fail=fail, node=node, port=port, run_id=run_id)
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
        }
        for c in cells
    ]


def main() -> None:
    port = int(sys.argv[1])
    kernels = [Kernel(), Kernel()]
    try:
        for k in kernels:
            k.run(SETUP).ok()
        ok = both(kernels, port, -1, "ok")
        failed = both(kernels, port, 3, "fail")
        cell = both(kernels, port, -1, "cell", cell=True)
        left = [[p.cmdline() for p in k.children()] for k in kernels]  # the forkserver template aside
    finally:
        for k in kernels:
            k.shutdown()
    print(json.dumps({"ok": ok, "failed": failed, "cell": cell, "left": left}))


if __name__ == "__main__":
    main()
