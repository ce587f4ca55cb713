"""Live cells on a Ray cluster against live cells on this machine and a plain cell; and the time from a rank's
error to the next cell being ready, against starting a Ray Train run again (issue 31).

    python -m bench.ray_live            # 20 cells of each kind
    python -m bench.ray_live --quick    # 6 cells of each kind, 2 recoveries

It runs itself in a network namespace that has only a loopback interface (tests/netns.py: Ray listens on
every interface; there every interface is 127.0.0.1), with a ``ray.cluster_utils.Cluster`` of a head without
CPUs and two worker nodes of 1 CPU each, so that the 2 Ray ranks are on two nodes. Two kernels: one whose
``nblaunch.yaml`` says ``engine: ray`` (``%distributed_start -n 2 --engine ray``), one with 2 local live ranks
(fork, gloo). Cells, interleaved and the order turning round each time: a plain ``x = 1`` in each kernel (the
floor), ``%%distributed`` ``x = 1`` on each world, and one ``all_reduce``.

Recovery: a cell in which rank 1 raises while rank 0 waits in ``all_reduce``, then ``%%distributed x = 1``;
the figure is the wall time from the failing cell's execute_request to the next cell's end, both worlds keeping
their ranks (the same processes). What a Ray Train user pays instead: Ray Train restarts the whole worker group
on a failure (its FailureConfig), so the floor of that is one new ``TorchTrainer.fit()`` of 2 workers whose
function only brings up the process group and passes a barrier: measured here on the same cluster, after the
live session has given its bundles back. A restart also loses the workers' state, which the live world keeps.

Writes bench/results/ray_live.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from bench.harness import REPO, heading, note, run_cell, start_kernel, stop_tree, write_result

ALL_REDUCE = "%%distributed\nimport torch, torch.distributed as dist\nt = torch.ones(1)\ndist.all_reduce(t)"
ERROR_CELL = (
    "%%distributed\nt = torch.ones(1)\nif rank == 1:\n    raise ValueError('bad shard on rank 1')\ndist.all_reduce(t)"
)
LIVE_X = "%%distributed\nx = 1"
INSIDE = "NBLAUNCH_BENCH_RAY_INSIDE"


def _timed(k, code: str, *, fails: bool = False) -> float:
    t0 = time.perf_counter()
    cell = k.run(code, timeout=300)
    took = time.perf_counter() - t0
    if (cell.error is not None) != fails:
        raise RuntimeError(f"{code!r}: " + ("did not fail" if fails else "\n".join(cell.error["traceback"])))
    return took


def _pids(k) -> list[int]:
    code = "from kernelside.live import registry\nprint(json.dumps([r['pid'] for r in registry.current().status()]))"
    return json.loads(k.run(code, timeout=60).ok().stdout)


def _ray_train_fit(address: str, storage: str) -> float:
    """One TorchTrainer.fit() of 2 workers (1 CPU each) whose function passes a barrier: the floor of a restart."""
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    def barrier():
        import torch.distributed as dist

        dist.barrier()

    if not ray.is_initialized():
        ray.init(address=address, log_to_driver=False)
    trainer = TorchTrainer(
        barrier,
        scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
        run_config=RunConfig(storage_path=storage, name=f"bench-{time.monotonic_ns()}"),
    )
    t0 = time.perf_counter()
    trainer.fit()
    return time.perf_counter() - t0


def measure(cells: int, recoveries: int) -> dict:
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    kernels = {}
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        folders = {w: tempfile.mkdtemp(prefix=f"nblaunch-bench-{w}-") for w in ("ray", "local")}
        with open(os.path.join(folders["ray"], "nblaunch.yaml"), "w") as fh:
            fh.write(f"engine: ray\nray_address: '{cluster.address}'\n")
        for world in ("ray", "local"):
            kernels[world] = k = start_kernel(cwd=folders[world])
            run_cell(k, "%load_ext kernelside\nimport json", timeout=120)
        t0 = time.perf_counter()
        run_cell(kernels["ray"], "%distributed_start -n 2 --engine ray", timeout=300)
        started = {"ray": time.perf_counter() - t0}
        t0 = time.perf_counter()
        run_cell(kernels["local"], "%distributed_start -n 2", timeout=300)
        started["local"] = time.perf_counter() - t0
        kinds = {"plain `x = 1`": "x = 1", "live `x = 1`": LIVE_X, "live `all_reduce`": ALL_REDUCE}
        for k in kernels.values():
            for _ in range(3):  # imports and warm-up
                for code in kinds.values():
                    _timed(k, code)
        got = {w: {name: [] for name in kinds} for w in kernels}
        order = [(w, name) for name in kinds for w in kernels]
        for i in range(cells):
            for w, name in order if i % 2 == 0 else reversed(order):
                got[w][name].append(_timed(kernels[w], kinds[name]))
        recovered = {w: [] for w in kernels}
        same = {}
        for w, k in kernels.items():
            before = _pids(k)
            for _ in range(recoveries):
                recovered[w].append(_timed(k, ERROR_CELL, fails=True) + _timed(k, LIVE_X))
            same[w] = _pids(k) == before
        run_cell(kernels["ray"], "%distributed_stop", timeout=120)
        storage = tempfile.mkdtemp(prefix="nblaunch-bench-ray-train-")
        restarts = [_ray_train_fit(cluster.address, storage) for _ in range(max(2, recoveries))]
        run_cell(kernels["local"], "%distributed_stop", timeout=120)
        return {"cells": got, "recovered": recovered, "same": same, "restarts": restarts, "started": started}
    finally:
        for k in kernels.values():
            k.shutdown()
        import ray

        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()
        left = stop_tree()
        if left:
            note(f"stopped {len(left)} process(es) left after the kernels and the cluster: {left}")


def table(r: dict) -> list[str]:
    med = statistics.median
    out = ["| world | cell | median (ms) | vs plain cell |", "|---|---|---|---|"]
    for w, label in (("local", "2 local live ranks"), ("ray", "2 Ray live ranks, 2 nodes")):
        plain = med(r["cells"][w]["plain `x = 1`"])
        for name, times in r["cells"][w].items():
            ratio = "" if name.startswith("plain") else f"{med(times) / plain:.2f}x"
            out.append(f"| {label} | {name} | {med(times) * 1e3:.1f} | {ratio} |")
    restart = med(r["restarts"])
    out += [
        "",
        "| from a rank's error to the next cell's end | median (s) | vs a new Ray Train run | ranks kept |",
        "|---|---|---|---|",
    ]
    for w, label in (("local", "local live world"), ("ray", "Ray live world")):
        rec = med(r["recovered"][w])
        kept = "yes, same processes" if r["same"][w] else "NO"
        out.append(f"| {label} | {rec:.2f} | {rec / restart:.2f}x | {kept} |")
    out.append(f"| a new Ray Train run (TorchTrainer.fit, 2 workers, one barrier) | {restart:.2f} | 1.00x | no |")
    out += ["", f"Start of the live world: Ray {r['started']['ray']:.1f} s, local {r['started']['local']:.1f} s."]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--cells", type=int, help="cells of each kind (default 20, --quick 6)")
    a = ap.parse_args()
    if os.environ.get(INSIDE) != "1":  # run again, loopback-only
        sys.path.insert(0, os.path.join(REPO, "tests"))
        from netns import loopback_only

        env = {**os.environ, INSIDE: "1", "GLOO_SOCKET_IFNAME": "lo", "RAY_USAGE_STATS_ENABLED": "0"}
        argv = loopback_only([sys.executable, "-m", "bench.ray_live", *sys.argv[1:]])
        return subprocess.run(argv, env=env, cwd=REPO, check=False).returncode
    cells = a.cells or (6 if a.quick else 20)
    recoveries = 2 if a.quick else 5
    one, five, _ = os.getloadavg()
    note(f"a 3-node Ray cluster and two kernels, {cells} cells of each kind, {recoveries} recoveries")
    r = measure(cells, recoveries)
    after, _, _ = os.getloadavg()
    how = (
        f"gloo, 2 ranks, medians of {cells} interleaved cells per kind, {recoveries} recoveries; load average "
        f"{one:.1f} (5 min: {five:.1f}) at the start, {after:.1f} at the end"
    )
    text = "\n".join([heading("Live cells on a Ray cluster", "ray_live", a.quick, how), "", *table(r), ""])
    write_result("ray_live", a.quick, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
