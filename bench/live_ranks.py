"""Live cells against a plain cell at 2, 4 and 8 live ranks, in one kernel (issue 34).

    python -m bench.live_ranks                  # 40 cells of each kind per size
    python -m bench.live_ranks --quick          # 2 and 8 ranks, 10 cells
    python -m bench.live_ranks --before ../main # the same in a kernel running another checkout, after this one

For each size N a live session of N ranks (fork, gloo) is started in the kernel, and three cells are run
interleaved, the order turning round each time so that drift hits them alike: a plain kernel cell
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


def measure(k, n: int, cells: int, *, flags: str = "", kinds: dict | None = None) -> dict[str, list[float]]:
    """Interleaved wall times of the cells (``kinds``, by default the three above) on a live session of ``n``
    ranks started with ``flags``."""
    kinds = kinds or KINDS
    run_cell(k, f"%distributed_start -n {n} {flags}".strip(), timeout=300)
    try:
        run_cell(k, ALL_REDUCE, timeout=120)  # the ranks' imports, once
        for _ in range(3):  # warm-up
            for code in kinds.values():
                _timed(k, code)
        got = {name: [] for name in kinds}
        for i in range(cells):
            for name in list(kinds) if i % 2 == 0 else list(reversed(kinds)):
                got[name].append(_timed(k, kinds[name]))
        return got
    finally:
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


def run_all(source: str, sizes, cells: int, *, env: dict | None = None, flags: str = "", kinds=None) -> tuple:
    """Each size in a kernel running ``source``'s nblaunch (``env``: more of its environment); (times, loads)."""
    k = start_kernel(pythonpath=source, env=env)
    results, loads = {}, {}
    try:
        run_cell(k, "%load_ext kernelside", timeout=120)
        for n in sizes:
            note(f"{source}: {n} live ranks, {cells} cells of each kind")
            results[n] = measure(k, n, cells, flags=flags, kinds=kinds)
            loads[n] = _load()
            plain = statistics.median(results[n]["plain `x = 1`"])
            note(
                f"  {n} ranks: "
                + ", ".join(
                    f"{m} {statistics.median(v) * 1e3:.1f} ms ({statistics.median(v) / plain:.2f}x)"
                    for m, v in results[n].items()
                )
                + f"; load {loads[n]}"
            )
    finally:
        k.shutdown()
        deadline = time.monotonic() + 5.0  # the ranks see their kernel gone (parent-death signal) and end
        while descendants() and time.monotonic() < deadline:
            time.sleep(0.05)
        left = stop_tree()
        if left:
            note(f"stopped {len(left)} process(es) left after the kernel: {left}")
    return results, loads


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--cells", type=int, help="cells of each kind per size (default 40, --quick 10)")
    ap.add_argument("--sizes", default=None, help="comma-separated numbers of live ranks (default 2,4,8)")
    ap.add_argument("--before", metavar="PATH", help="another checkout, measured the same way after this one")
    a = ap.parse_args()
    adopt_orphans()
    sizes = [int(s) for s in a.sizes.split(",")] if a.sizes else ([2, 8] if a.quick else [2, 4, 8])
    cells = a.cells or (10 if a.quick else 40)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    load_before = _load()
    results, loads = run_all(here, sizes, cells)
    table = [
        "| ranks | cell | median (ms) | vs plain cell | target | load average after |",
        "|---|---|---|---|---|---|",
        *rows(sizes, results, loads),
    ]
    if a.before:
        before, before_loads = run_all(os.path.abspath(a.before), sizes, cells)
        table += rows(sizes, before, before_loads, who="before, ")
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
