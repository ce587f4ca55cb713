"""Live cells against a plain cell at 2, 4 and 8 live ranks, in one kernel (issue 34).

    python -m bench.live_ranks                  # 40 cells of each kind per size
    python -m bench.live_ranks --quick          # 2 and 8 ranks, 10 cells
    python -m bench.live_ranks --before ../main # also another checkout, in a kernel of its own, interleaved

For each size N a live session of N ranks (fork, gloo) is started in the kernel, and three cells are run
interleaved, in a new shuffled order each round (seeded: the same in every run) so that drift, and the
cell that runs just before (an 8-rank cell leaves the 2 cores busy for a moment), hit them alike: a plain kernel cell
``x = 1`` (the floor: the kernel's own round trip), ``%%distributed`` ``x = 1`` and a ``%%distributed``
cell doing one ``all_reduce``. Wall time from execute_request to the kernel's idle, as a notebook sees
it; medians; the ratio to the plain cell's median of the same size. Targets: live ``x = 1`` within 1.3x at
2 ranks and 1.5x at 8, ``all_reduce`` within 1.7x at 8. The load average is printed with every size: the
machine is shared with other work, and these figures move with it.

Writes bench/results/live_ranks.md.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

from bench.harness import adopt_orphans, descendants, heading, note, run_cell, start_kernel, stop_tree, write_result

ALL_REDUCE = "%%distributed\nimport torch, torch.distributed as dist\nt = torch.ones(1)\ndist.all_reduce(t)"
KINDS = {"plain `x = 1`": "x = 1", "live `x = 1`": "%%distributed\nx = 1", "live `all_reduce`": ALL_REDUCE}
TARGETS = {("live `x = 1`", 2): 1.3, ("live `x = 1`", 8): 1.5, ("live `all_reduce`", 8): 1.7}


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"{one:.1f} (5 min: {five:.1f})"


def _timed(k, code: str) -> float:
    t0 = time.perf_counter()
    run_cell(k, code, timeout=120)
    return time.perf_counter() - t0


def measure(kernels: dict, n: int, cells: int, *, flags: str = "", kinds: dict | None = None) -> dict:
    """Interleaved wall times of the cells (``kinds``, by default the three above) on a live session of ``n`` ranks
    started with ``flags`` in each kernel (``{label: kernel}``): cell by cell, kernel by kernel, in a new seeded
    shuffle each round, so that the machine's load hits every cell and every checkout alike.
    ``{label: {cell: [s]}}``."""
    kinds = kinds or KINDS
    for k in kernels.values():
        run_cell(k, f"%distributed_start -n {n} {flags}".strip(), timeout=300)
    try:
        for k in kernels.values():
            run_cell(k, ALL_REDUCE, timeout=120)  # the ranks' imports, once
            for _ in range(3):  # warm-up
                for code in kinds.values():
                    _timed(k, code)
        got = {label: {name: [] for name in kinds} for label in kernels}
        order = [(label, name) for name in kinds for label in kernels]
        shuffle = random.Random(n).shuffle  # (turning the order round instead put one kernel's plain cell
        for _ in range(cells):  # always after a plain one, the other's after a live one: 0.5 ms apart at 8 ranks)
            shuffle(order)
            for label, name in order:
                got[label][name].append(_timed(kernels[label], kinds[name]))
        return got
    finally:
        for k in kernels.values():
            run_cell(k, "%distributed_stop", timeout=120)


def rows(sizes, results: dict[int, dict], loads: dict[int, str], who: str = "") -> list[str]:
    """Markdown rows: ranks, cell, median, ratio to the plain cell, the target's verdict, the load."""
    out = []
    for n in sizes:
        got = results[n]
        plain = statistics.median(got["plain `x = 1`"])
        for name, times in got.items():
            med = statistics.median(times)
            ratio = "" if name.startswith("plain") else f"{med / plain:.2f}x"
            target = TARGETS.get((name, n))
            verdict = "" if target is None else (f"≤ {target}x: " + ("met" if med / plain <= target else "not met"))
            out.append(f"| {who}{n} | {name} | {med * 1e3:.1f} | {ratio} | {verdict} | {loads[n]} |")
    return out


def run_all(sources: dict, sizes, cells: int, *, env: dict | None = None, flags: str = "", kinds=None) -> tuple:
    """Each size in one kernel per checkout (``{label: path}``; ``env``: more of their environment), interleaved;
    ``({label: {size: {cell: [s]}}}, {size: load average after it})``."""
    kernels = {label: start_kernel(pythonpath=path, env=env) for label, path in sources.items()}
    results: dict = {label: {} for label in sources}
    loads = {}
    try:
        for k in kernels.values():
            run_cell(k, "%load_ext kernelside", timeout=120)
        for n in sizes:
            note(f"{n} live ranks, {cells} cells of each kind in each of {', '.join(sources)}")
            got = measure(kernels, n, cells, flags=flags, kinds=kinds)
            loads[n] = _load()
            for label, times in got.items():
                results[label][n] = times
                plain = statistics.median(times["plain `x = 1`"])
                note(
                    f"  {label}, {n} ranks: "
                    + ", ".join(f"{m} {statistics.median(v) * 1e3:.1f} ms" for m, v in times.items())
                    + f" (live x = 1: {statistics.median(times['live `x = 1`']) / plain:.2f}x); load {loads[n]}"
                )
    finally:
        for k in kernels.values():
            k.shutdown()
        deadline = time.monotonic() + 5.0  # the ranks see their kernel gone (parent-death signal) and end
        while descendants() and time.monotonic() < deadline:
            time.sleep(0.05)
        left = stop_tree()
        if left:
            note(f"stopped {len(left)} process(es) left after the kernels: {left}")
    return results, loads


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--cells", type=int, help="cells of each kind per size (default 40, --quick 10)")
    ap.add_argument("--sizes", default=None, help="comma-separated numbers of live ranks (default 2,4,8)")
    ap.add_argument("--before", metavar="PATH", help="another checkout, in a kernel of its own, cell by cell")
    a = ap.parse_args()
    adopt_orphans()
    sizes = [int(s) for s in a.sizes.split(",")] if a.sizes else ([2, 8] if a.quick else [2, 4, 8])
    cells = a.cells or (10 if a.quick else 40)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    load_before = _load()
    sources = {"now": here, **({"before": os.path.abspath(a.before)} if a.before else {})}
    results, loads = run_all(sources, sizes, cells)
    table = [
        "| ranks | cell | median (ms) | vs plain cell | target | load average after |",
        "|---|---|---|---|---|---|",
        *rows(sizes, results["now"], loads),
    ]
    if a.before:
        table += rows(sizes, results["before"], loads, who="before, ")
    flags = (f" --sizes {a.sizes}" if a.sizes else "") + (f" --cells {a.cells}" if a.cells else "")
    flags += f" --before {a.before}" if a.before else ""
    text = "\n".join(
        [
            heading(
                "Live cells against a plain cell",
                "live_ranks",
                a.quick,
                f"fork, gloo, medians of {cells} interleaved cells per kind and size, load average {load_before} "
                "at the start",
                flags=flags,
            ),
            "",
            *table,
            "",
        ]
    )
    write_result("live_ranks", a.quick, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
