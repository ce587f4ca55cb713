"""A real kernel's live Ray ranks through what goes wrong on a cluster: ``--timeout``, mismatched collectives, a
rank's process SIGKILLed and a node removed (``cluster.remove_node``), each during a cell and between cells.

Run by test_ray_live_recovery.py inside a loopback-only network namespace. The cluster (``ray.cluster_utils``):
a head without CPUs and three worker nodes of 2 CPUs each, so 4 ranks fill two of them and the third has room
for the bundles of a removed node; a fourth is added after the second removal, for its bundles. What each step
showed is printed as one JSON object.
"""

from __future__ import annotations

import json
import os
import select
import sys
import tempfile
import time

import ray
from kernel import Kernel
from ray.cluster_utils import Cluster
from ray_live_driver import STATUS, shown, timed, wait_nothing_left

STATE_CELL = """%%distributed
import os, time, torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
torch.manual_seed(rank)
model = DDP(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(16, 4), torch.randn(16, 1)
for step in range(3):
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
mark = 100 + rank
"""

# every rank's own state, without a collective (a replacement has none of it): its mark and its model's sum
KEPT_CELL = """%%distributed --return-from all --return kept
has_model = "model" in globals()
kept = (globals().get("mark"), round(float(sum(p.sum() for p in model.parameters())), 5) if has_model else None)
"""

# a collective over every rank, with its own imports (a replacement starts empty) and a kernel value (scale)
TOTAL_CELL = """%%distributed --return total
import torch, torch.distributed as dist
t = torch.tensor([float(scale)])
dist.all_reduce(t)
total = t.item()
"""

BARRIER_CELL = """%%distributed
import time
if rank in SLEEPERS:
    while True:
        time.sleep(0.05)
if rank == 0:
    print("rank 0 in barrier", flush=True)
dist.barrier()
"""


def ranks(k) -> list[dict]:
    return json.loads(k.run(STATUS).ok().stdout)


def node_of(cluster, status_node: str):
    """The cluster's node object of a rank's node as %distributed_status names it: 'IP (first 8 of its id)'."""
    short = status_node.split("(")[1].rstrip(")")
    return next(n for n in cluster.list_all_nodes() if n.node_id.startswith(short))


def kept(k) -> dict:
    """Each rank's own state (KEPT_CELL), printed in the kernel."""
    cell = shown(k.run(KEPT_CELL))
    cell["kept"] = shown(k.run("print(kept)"))["stdout"] if cell["error"] is None else None
    return cell


def total(k) -> dict:
    """TOTAL_CELL over every rank, timed; its all-reduced total, printed in the kernel."""
    cell = timed(k, TOTAL_CELL)
    cell["total"] = shown(k.run("print(total)"))["stdout"] if cell["error"] is None else None
    return cell


def kept_and_total(k, out: dict, key: str) -> None:
    out[f"{key}_kept"] = kept(k)
    out[f"{key}_total"] = total(k)
    out[f"{key}_ranks"] = ranks(k)


def gone(pid: int, timeout: float = 30.0) -> bool:
    """The process ended within ``timeout`` (its pidfd says so: it is Ray's child, not this driver's)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], timeout)[0])
    finally:
        os.close(fd)


def during_cell(k, sleepers: set[int], act) -> dict:
    """BARRIER_CELL with ``sleepers`` in a sleep loop; ``act()`` once rank 0 waits in the barrier. When the cell
    first said something was lost, counted from the act (``named_s``)."""
    acted, named = [], []

    def watch(kind, content):
        text = content.get("text", "")
        if "rank 0 in barrier" in text and not acted:
            act()
            acted.append(time.monotonic())  # (a node's removal returns once its processes are gone)
        if "lost" in text and acted and not named:
            named.append(time.monotonic())

    out = timed(k, BARRIER_CELL.replace("SLEEPERS", repr(sleepers)), on_output=watch)
    out["named_s"] = named[0] - acted[0] if named and acted else None
    return out


def main() -> None:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    for _ in range(3):
        cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)  # this driver reads Ray's state (the GCS)
    folder = tempfile.mkdtemp(prefix="nblaunch-ray-recovery-")
    with open(os.path.join(folder, "nblaunch.yaml"), "w") as fh:
        fh.write(f"engine: ray\nray_address: '{cluster.address}'\n")
    out: dict = {}
    pids: list[int] = []
    k = Kernel(cwd=folder)
    try:
        k.run("%load_ext kernelside\nimport json").ok()
        out["start"] = timed(k, "%distributed_start -n 4 --engine ray")
        out["ranks"] = ranks(k)
        pids = [r["pid"] for r in out["ranks"]]
        k.run(STATE_CELL).ok()
        k.run("scale = 7\n%distributed_push scale").ok()
        out["kept_before"] = kept(k)

        # --timeout and mismatched collectives: every rank back to idle, its state kept, the same actors
        out["timeout"] = timed(
            k, "%%distributed --timeout 2\nif rank == 0:\n    dist.barrier()\nelse:\n    time.sleep(60)\n"
        )
        kept_and_total(k, out, "after_timeout")
        out["mismatch"] = timed(
            k, "%%distributed\nif rank == 0:\n    dist.barrier()\nelse:\n    dist.all_reduce(torch.ones(1))\n"
        )
        kept_and_total(k, out, "after_mismatch")

        # rank 2's process SIGKILLed during a cell (rank 2 sleeping, the others in a barrier)
        out["kill_during"] = during_cell(k, {2}, lambda: os.kill(pids[2], 9))
        kept_and_total(k, out, "after_kill_during")
        pids += [r["pid"] for r in out["after_kill_during_ranks"]]

        # rank 1's process SIGKILLed between cells: the next cell names it, replaces it, then runs
        victim = out["after_kill_during_ranks"][1]["pid"]
        os.kill(victim, 9)
        out["kill_between_gone"] = gone(victim)
        out["kill_between"] = total(k)
        kept_and_total(k, out, "after_kill_between")
        pids += [r["pid"] for r in out["after_kill_between_ranks"]]

        # the node holding ranks 2 and 3 removed during a cell: their bundles go to the spare node
        before = out["after_kill_between_ranks"]
        out["remove_during_node"] = before[3]["node"]
        doomed = node_of(cluster, before[3]["node"])
        out["remove_during"] = during_cell(k, {3}, lambda: cluster.remove_node(doomed))
        kept_and_total(k, out, "after_remove_during")
        pids += [r["pid"] for r in out["after_remove_during_ranks"]]

        # the node holding ranks 0 and 1 removed between cells, and a new node added for their bundles
        before = out["after_remove_during_ranks"]
        out["remove_between_node"] = before[0]["node"]
        cluster.remove_node(node_of(cluster, before[0]["node"]))
        cluster.add_node(num_cpus=2)
        out["remove_between"] = total(k)
        kept_and_total(k, out, "after_remove_between")
        pids += [r["pid"] for r in out["after_remove_between_ranks"]]

        out["stop"] = timed(k, "%distributed_stop")
        out["stop_left"] = wait_nothing_left(pids, timeout=15)
    except Exception as e:  # what ran so far, with the failure: the test says which step broke
        out["crash"] = f"{type(e).__name__}: {e}"
    finally:
        k.shutdown()
    out["kernel_end_left"] = wait_nothing_left(pids, timeout=30)
    ray.shutdown()
    cluster.shutdown()
    print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
