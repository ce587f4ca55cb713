"""Memory: a 2 GiB dataset made in the notebook, read by 4 workers. Total PSS of the notebook and its workers.

    python -m bench.memory            # 2 GiB float32 tensor (spawn: 512 MiB, see below), 2 runs per launcher
    python -m bench.memory --quick    # 256 MiB tensor, 1 run

Each case runs in its own "notebook" process (a driver started by this script; one at a time, so at
most one dataset is alive). The driver makes the tensor, then launches 4 workers that each sum a
quarter of it, meet at a barrier, write their pid and park until this script has measured; then they
pass a second barrier and return. While they are parked this script sums PSS (proportional set
size, from /proc/PID/smaps_rollup: shared pages split between their users) over the driver and
every process below it — one consistent snapshot.

Launchers: nblaunch fork, nblaunch spawn, Accelerate's notebook_launcher (it forks, through torch's
elastic agent). Under spawn the tensor must be pickled to every worker: 4 workers would hold 4 more
copies plus the pickle, about 8 copies at the peak, which for 2 GiB does not fit safely next to
other work on this 24 GiB machine — spawn runs with 512 MiB, and the ratio to one copy is what
compares. Every case checks MemAvailable first and is skipped, saying so, when it would not fit.

Writes bench/results/memory.md and prints it. Target (issue 6): under fork, total PSS under 1.3x one copy.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from bench.harness import (
    adopt_orphans,
    descendants,
    free_port,
    heading,
    median,
    mem_available,
    note,
    pss_bytes,
    stop_tree,
    write_result,
)

GiB = 1 << 30
WORKERS = 4
# copies of the dataset alive at the peak of a launch (spawn: the tensor, its pickle, the payload
# memfd, and in each worker the bytes read back plus the tensor rebuilt from them)
PEAK_COPIES = {"fork": 1.5, "spawn": 3 + 2 * WORKERS}


def reader(data, sync_dir: str) -> float:
    """In a worker: sum this rank's quarter, say we are parked, wait for the measurement, return."""
    import torch.distributed as dist

    if not dist.is_initialized():  # Accelerate leaves this to the user
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    part = data.numel() // world
    total = float(data[rank * part : (rank + 1) * part].sum())
    dist.barrier()
    with open(os.path.join(sync_dir, f"parked{rank}.tmp"), "w") as fh:
        fh.write(str(os.getpid()))
    os.rename(os.path.join(sync_dir, f"parked{rank}.tmp"), os.path.join(sync_dir, f"parked{rank}"))
    measured = os.path.join(sync_dir, "measured")
    while not os.path.exists(measured):
        time.sleep(0.01)
    dist.barrier()
    return total


def driver(launcher: str, nbytes: int, sync_dir: str) -> None:
    """The "notebook": make the dataset, launch, record its own PSS along the way."""
    import torch

    if launcher.startswith("nblaunch"):
        from kernelside import notebook_launcher

        method = launcher.split()[1]
        launch = lambda data: notebook_launcher(  # noqa: E731
            reader, args=(data, sync_dir), num_processes=WORKERS, start_method=method, output="none"
        )
    else:
        from accelerate import notebook_launcher

        launch = lambda data: notebook_launcher(  # noqa: E731
            reader, args=(data, sync_dir), num_processes=WORKERS, use_port=str(free_port())
        )
    before = pss_bytes(os.getpid())
    data = torch.ones(nbytes // 4, dtype=torch.float32)
    with_data = pss_bytes(os.getpid())
    total = launch(data)  # Accelerate's notebook_launcher returns nothing
    assert total in (None, float(nbytes // 4 // WORKERS)), total
    with open(os.path.join(sync_dir, "driver.json"), "w") as fh:
        json.dump({"before": before, "with_data": with_data, "after": pss_bytes(os.getpid())}, fh)


def measure(launcher: str, nbytes: int, timeout: float = 300) -> dict:
    """Run one case in a fresh driver; PSS of the whole tree while the workers are parked."""
    sync = tempfile.mkdtemp(prefix="nblaunch-bench-memory-")
    log = open(os.path.join(sync, "driver.log"), "wb")
    cmd = [sys.executable, "-m", "bench.memory", "--driver", launcher, str(nbytes), sync]
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.monotonic() + timeout
    try:
        while not all(os.path.exists(os.path.join(sync, f"parked{r}")) for r in range(WORKERS)):
            if p.poll() is not None:
                raise RuntimeError(
                    f"{launcher}: driver ended ({p.returncode}) before the workers parked; see {log.name}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"{launcher}: workers did not park within {timeout}s; see {log.name}")
            time.sleep(0.02)
        tree = [p.pid] + descendants(p.pid)
        per = {}
        for pid in tree:
            try:
                per[pid] = pss_bytes(pid)
            except (OSError, RuntimeError):
                pass  # ended between listing and reading
        workers = {int(open(os.path.join(sync, f"parked{r}")).read()) for r in range(WORKERS)}
        open(os.path.join(sync, "measured"), "w").close()
        p.wait(timeout=max(1, deadline - time.monotonic()))
    finally:
        if p.poll() is None:
            stop_tree(p.pid)
            p.wait()
        log.close()
    if p.returncode != 0:
        raise RuntimeError(f"{launcher}: driver failed ({p.returncode}); see {log.name}")
    with open(os.path.join(sync, "driver.json")) as fh:
        stages = json.load(fh)
    return {
        "total": sum(per.values()),
        "driver": per.get(p.pid, 0),
        "workers": sum(v for pid, v in per.items() if pid in workers),
        "others": sum(v for pid, v in per.items() if pid != p.pid and pid not in workers),
        "processes": len(per),
        **stages,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="256 MiB, 1 run")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--driver", nargs=3, metavar=("LAUNCHER", "BYTES", "DIR"), help=argparse.SUPPRESS)
    ns = ap.parse_args()
    if ns.driver:
        driver(ns.driver[0], int(ns.driver[1]), ns.driver[2])
        return 0
    adopt_orphans()
    full, runs = (GiB // 4, 1) if ns.quick else (2 * GiB, ns.runs)
    sizes = {"nblaunch fork": full, "nblaunch spawn": min(full, GiB // 2), "accelerate notebook_launcher": full}
    results: dict[str, list[dict]] = {}
    skipped = {}
    for r in range(runs):
        for launcher, nbytes in sizes.items():
            need = nbytes * PEAK_COPIES["spawn" if "spawn" in launcher else "fork"] + GiB
            if mem_available() < 1.5 * need:
                skipped[launcher] = f"needs about {need / GiB:.1f} GiB, {mem_available() / GiB:.1f} GiB available"
                note(f"skipping {launcher}: {skipped[launcher]}")
                continue
            results.setdefault(launcher, []).append(measure(launcher, nbytes))
            m = results[launcher][-1]
            note(f"run {r + 1}/{runs} {launcher}: total {m['total'] / GiB:.2f} GiB ({m['total'] / nbytes:.2f}x)")
    left = descendants()
    if left:
        note(f"left behind: {left}")
        stop_tree()

    lines = [
        heading("Memory of a launch", "memory", ns.quick, f"median of {runs} run(s), {WORKERS} workers"),
        "",
        "PSS in GiB while the 4 workers are parked after reading their quarter of the dataset (*notebook*: the "
        "process that made the dataset and launched; *before*: its PSS before making the dataset; *others*: "
        "any further process below it; *after the call*: the notebook once the launch returned, dataset still held).",
        "",
        "| launcher | dataset (GiB) | notebook before | notebook during | workers | others | processes | "
        "total | total / one copy | notebook after the call |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    ratios = {}
    for launcher, nbytes in sizes.items():
        if launcher not in results:
            lines.append(f"| {launcher} | {nbytes / GiB:.2f} | skipped: {skipped.get(launcher, '')} ||||||||")
            continue
        rs = results[launcher]
        keys = ("before", "driver", "workers", "others", "processes", "total", "after")
        m = {k: median(x[k] for x in rs) for k in keys}
        ratios[launcher] = m["total"] / nbytes
        lines.append(
            f"| {launcher} | {nbytes / GiB:.2f} | {m['before'] / GiB:.2f} | {m['driver'] / GiB:.2f} | "
            f"{m['workers'] / GiB:.2f} | {m['others'] / GiB:.2f} | {m['processes']:.0f} | {m['total'] / GiB:.2f} | "
            f"{ratios[launcher]:.2f}x | {m['after'] / GiB:.2f} |"
        )
    fork = ratios.get("nblaunch fork")
    if fork is None:
        verdict = "not measured"
    elif ns.quick:
        verdict = f"judged by the full run ({fork:.2f}x here, where the interpreters' own PSS outweighs 256 MiB)"
    else:
        verdict = f"{'met' if fork < 1.3 else 'NOT met'} ({fork:.2f}x one copy)"
    lines += ["", f"Target: under fork, total PSS under 1.3x one copy — {verdict}."]
    if left:
        lines.append(f"\nProcesses left behind (then stopped): {left}.")
    write_result("memory", ns.quick, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
