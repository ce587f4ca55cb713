"""Launch latency as the number of workers grows: N = 1, 2, 4, 8, 16, nblaunch fork.

    python -m bench.scale            # N = 1..16, median of 9 launches after a warm-up launch
    python -m bench.scale --quick    # N = 1, 2, 4, median of 2

For each N: start-up (from the call until every rank runs user code with the process group up,
from the time each rank writes on entry) and end to end (the whole call for a function that does a
barrier and returns). Side by side, as a reference, torch.multiprocessing.start_processes with fork
and the process-group set-up written by hand (what nblaunch's fork path is built on). Launches
alternate between the two so that drift hits both alike. This machine has 2 cores: from N = 4 on,
workers share cores.

Writes bench/results/scale.md and prints it.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

from bench.harness import adopt_orphans, descendants, free_port, heading, median, note, stop_tree, write_result


def _mark(outdir: str, rank: int) -> None:
    with open(os.path.join(outdir, f"ready{rank}"), "w") as fh:
        fh.write(repr(time.time()))


def trivial(outdir: str) -> int:
    import torch.distributed as dist

    _mark(outdir, dist.get_rank())
    dist.barrier()
    return 0


def trivial_by_hand(rank: int, world: int, port: int, outdir: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    _mark(outdir, rank)
    dist.barrier()
    dist.destroy_process_group()


def run_nblaunch(n: int, outdir: str) -> None:
    from kernelside import notebook_launcher

    notebook_launcher(trivial, args=(outdir,), num_processes=n, start_method="fork", output="none")


def run_mp(n: int, outdir: str) -> None:
    import torch.multiprocessing as mp

    mp.start_processes(trivial_by_hand, args=(n, free_port(), outdir), nprocs=n, start_method="fork")


def once(fn, n: int) -> tuple[float, float]:
    outdir = tempfile.mkdtemp(prefix="nblaunch-bench-scale-")
    t0 = time.time()
    fn(n, outdir)
    t1 = time.time()
    ready = [float(open(os.path.join(outdir, f"ready{r}")).read()) for r in range(n)]
    return max(ready) - t0, t1 - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="N = 1, 2, 4; 2 launches each")
    ap.add_argument("--runs", type=int, default=9)
    ns = ap.parse_args()
    adopt_orphans()
    sizes, runs = ((1, 2, 4), 2) if ns.quick else ((1, 2, 4, 8, 16), ns.runs)
    launchers = {"nblaunch fork": run_nblaunch, "torch.multiprocessing fork": run_mp}
    once(run_nblaunch, 2)  # warm-up: the first nblaunch fork launch imports torch._dynamo in this process
    once(run_mp, 2)
    got: dict[tuple[str, int], list[tuple[float, float]]] = {}
    leaks = []
    for n in sizes:
        for _ in range(runs):
            for name, fn in launchers.items():
                got.setdefault((name, n), []).append(once(fn, n))
                left = descendants()
                if left:
                    leaks.append((name, n, left))
                    stop_tree()
        for name in launchers:
            s, e = median(x[0] for x in got[(name, n)]), median(x[1] for x in got[(name, n)])
            note(f"N={n} {name}: start-up {s * 1e3:.1f} ms, end to end {e * 1e3:.1f} ms")

    def med(name, n, i):
        return median(x[i] for x in got[(name, n)])

    lines = [
        heading("Launch latency by number of workers", "scale", ns.quick, f"median of {runs} launches per cell"),
        "",
        "Milliseconds. *Per added worker*: (value at N - value at N=1) / (N - 1).",
        "",
        "| N | nblaunch start-up | nblaunch end to end | per added worker (end to end) | vs N=1 | "
        "mp fork start-up | mp fork end to end | nblaunch vs mp fork |",
        "|---|---|---|---|---|---|---|---|",
    ]
    nb, mp = "nblaunch fork", "torch.multiprocessing fork"
    base = med(nb, sizes[0], 1)
    for n in sizes:
        e = med(nb, n, 1)
        per = "-" if n == sizes[0] else f"{(e - base) / (n - sizes[0]) * 1e3:.1f}"
        lines.append(
            f"| {n} | {med(nb, n, 0) * 1e3:.1f} | {e * 1e3:.1f} | {per} | {e / base:.1f}x | "
            f"{med(mp, n, 0) * 1e3:.1f} | {med(mp, n, 1) * 1e3:.1f} | {e / med(mp, n, 1):.2f}x |"
        )
    top = sizes[-1]
    lines += [
        "",
        f"Growth: nblaunch end to end goes from {base * 1e3:.0f} ms at N={sizes[0]} to {med(nb, top, 1) * 1e3:.0f} ms "
        f"at N={top} ({med(nb, top, 1) / base:.1f}x, about {(med(nb, top, 1) - base) / (top - sizes[0]) * 1e3:.0f} ms "
        f"per added worker); torch.multiprocessing fork: {med(mp, sizes[0], 1) * 1e3:.0f} ms to "
        f"{med(mp, top, 1) * 1e3:.0f} ms.",
    ]
    if leaks:
        lines.append(f"\nProcesses left behind (then stopped): {leaks}.")
    write_result("scale", ns.quick, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
