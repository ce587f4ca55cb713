"""A one-shot launch's own cost at 2, 4 and 8 ranks: nblaunch's ``notebook_launcher`` against Accelerate's.

    python -m bench.launch_ranks            # N = 2, 4, 8; median of 5 after a warm-up, interleaved
    python -m bench.launch_ranks --quick    # N = 2, 4; median of 2
    python -m bench.launch_ranks --before ../main   # also nblaunch from another checkout, in a kernel of its own

Both launch the same small function in one real kernel, as a notebook would: the process group up
(Accelerate's ``PartialState``, which under nblaunch finds the group nblaunch set up), one barrier,
return 1. Each launch is timed from the client (execute request to idle), and the two launchers
alternate so that drift hits both alike. Both fork (Accelerate's launcher always does on CPU) and
use gloo. The per-rank increment is the slope of a least-squares line through the medians.

Writes bench/results/launch_ranks.md and prints it.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time

import psutil

from bench.harness import adopt_orphans, descendants, heading, note, start_kernel, stop_tree, write_result

SETUP = """
%load_ext kernelside
import os
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
from accelerate import notebook_launcher as accelerate_launcher
from kernelside import notebook_launcher as nblaunch_launcher

def small():
    from accelerate import PartialState
    PartialState().wait_for_everyone()
    return 1
"""

BEFORE = "nblaunch before"
LAUNCHERS = {
    "nblaunch": "nblaunch_launcher(small, num_processes={n})",
    "Accelerate": "accelerate_launcher(small, num_processes={n})",
}


ANSI = re.compile(r"\x1b\[[0-9;]*m")
HANG_S = 60.0  # a launch of this small function that has not ended by then never will (Accelerate's can hang)


def _timed(k, code: str) -> float | str:
    """Seconds the cell took, or what went wrong: a launch that hung (its processes are then ended by pid and the
    cell waited on) or failed (its error's name and first line) is counted apart, never timed."""
    t0 = time.perf_counter()
    try:
        cell = k.run(code, timeout=HANG_S)
    except TimeoutError as e:
        for p in psutil.Process(k.pid).children(recursive=True):  # the hung launch's ranks (one launch at a time)
            p.kill()
        k.wait(e.cell, timeout=60)
        return f"never ended (ended after {HANG_S:.0f} s by pid)"
    took = time.perf_counter() - t0
    if cell.error is not None:
        first = ANSI.sub("", cell.error["evalue"]).strip().splitlines()[:1]
        return f"failed: {cell.error['ename']}: {first[0] if first else ''}"[:200]
    return took


def _setup(k, code: str) -> None:
    took = _timed(k, code)
    if isinstance(took, str):
        raise RuntimeError(f"the bench's set-up {took}")


def slope(points: list[tuple[int, float]]) -> float:
    """Least-squares slope of (ranks, seconds): what one more rank costs."""
    mx = statistics.fmean(n for n, _ in points)
    my = statistics.fmean(t for _, t in points)
    return sum((n - mx) * (t - my) for n, t in points) / sum((n - mx) ** 2 for n, _ in points)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="N = 2, 4; 2 launches each")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--before", metavar="PATH", help="another checkout: its nblaunch too, in a second kernel")
    ns = ap.parse_args()
    adopt_orphans()
    sizes, runs = ((2, 4), 2) if ns.quick else ((2, 4, 8), ns.runs)
    kernels = {"nblaunch": start_kernel(), "Accelerate": None}
    kernels["Accelerate"] = kernels["nblaunch"]
    launchers = dict(LAUNCHERS)
    if ns.before:
        kernels[BEFORE] = start_kernel(pythonpath=os.path.abspath(ns.before))
        launchers[BEFORE] = LAUNCHERS["nblaunch"]
    got: dict[tuple[str, int], list[float]] = {}
    apart: dict[str, list[str]] = {}  # per launcher: what each launch left out of the medians was
    try:
        for k in set(kernels.values()):
            _setup(k, SETUP)
        for name, code in launchers.items():  # warm-up: first imports, nblaunch's warm-up thread
            _timed(kernels[name], code.format(n=2))
        for n in sizes:
            for _ in range(runs):
                for name, code in launchers.items():
                    took = _timed(kernels[name], code.format(n=n))
                    if isinstance(took, str):
                        apart.setdefault(name, []).append(f"{n} ranks: {took}")
                    else:
                        got.setdefault((name, n), []).append(took)
    finally:
        for k in set(kernels.values()):
            k.shutdown()
        left = descendants()
        stop_tree()
    load = os.getloadavg()[0]
    lines = [
        heading(
            "A one-shot launch's cost, nblaunch's notebook_launcher against Accelerate's",
            "launch_ranks",
            ns.quick,
            f"median of {runs} interleaved launches per cell after a warm-up, one kernel, fork + gloo",
        ),
        "",
        f"Load average {load:.1f} at the end, on {os.cpu_count()} cores.",
        "",
        "| ranks | nblaunch `notebook_launcher` | Accelerate `notebook_launcher` | ratio |",
        "|---|---|---|---|",
    ]
    med = {key: statistics.median(v) for key, v in got.items()}
    for n in sizes:
        a, b = med[("nblaunch", n)], med[("Accelerate", n)]
        lines.append(f"| {n} | {a * 1000:.0f} ms | {b * 1000:.0f} ms | {a / b:.2f}x |")
    if ns.before:
        lines += [
            "",
            f"nblaunch from `{ns.before}` (the code before), interleaved with the above in a kernel of its own:",
            "",
        ]
        lines += ["| ranks | before | now | now / before |", "|---|---|---|---|"]
        for n in sizes:
            a, b = med[(BEFORE, n)], med[("nblaunch", n)]
            lines.append(f"| {n} | {a * 1000:.0f} ms | {b * 1000:.0f} ms | {b / a:.2f}x |")
    per_rank = {name: slope([(n, med[(name, n)]) for n in sizes]) for name in launchers}
    lines += [
        "",
        "Each further rank costs: "
        + ", ".join(f"{name} {s * 1000:.0f} ms" for name, s in per_rank.items())
        + f" (least squares over N = {', '.join(map(str, sizes))}).",
    ]
    for name, what in apart.items():
        lines.append(f"\n{name}: {len(what)} launch(es) left out of the medians: " + "; ".join(what))
    if left:
        lines.append(f"\nLeft running after the kernel's shutdown (stopped by pid): {left}")
    text = "\n".join(lines)
    write_result("launch_ranks", quick=ns.quick, text=text)
    note(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
