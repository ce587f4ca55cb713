"""Launches through the forkserver against fork and spawn, and live cells against a plain cell, in one kernel.

    python -m bench.forkserver            # N = 2 and 4, 9 launches per method, 50 cells per live figure
    python -m bench.forkserver --quick    # N = 2, 3 launches, 15 cells

Measured from the client, as a notebook sees a cell (execute request to idle), in one real kernel:
- one-shot ``%%distributed -n N --start-method M`` of ``x = rank`` for M = fork, forkserver, spawn,
  interleaved round by round so that the machine's load hits all three alike; medians after one
  warm-up launch of each (the forkserver's warm-up starts its template: that time is reported apart);
- a live session's start, ``%distributed_start -n 2`` then ``%distributed_stop``, fork against forkserver;
- the template's memory (RSS and PSS, read from /proc) while it idles;
- ``%load_ext kernelside`` in fresh kernels (``--before PATH``: the same for another checkout);
- the live round trip: a plain ``x = 1``, ``%%distributed`` ``x = 1`` and one ``all_reduce`` on 2 live
  ranks, interleaved, medians.

Writes bench/results/forkserver.md. The machine is shared with other work: figures move with its load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from bench.harness import adopt_orphans, descendants, heading, note, pss_bytes, start_kernel, stop_tree, write_result
from bench.launch import load_ext_seconds

METHODS = ("fork", "forkserver", "spawn")
ALL_REDUCE = "%%distributed\ndist.all_reduce(t)"


def _timed(k, code: str, timeout: float = 300) -> float:
    t0 = time.perf_counter()
    cell = k.run(code, timeout=timeout)
    took = time.perf_counter() - t0
    if cell.error is not None:
        raise RuntimeError("cell failed:\n" + "\n".join(cell.error["traceback"]))
    return took


def _ms(xs: list[float]) -> str:
    return f"{statistics.median(xs) * 1e3:.1f}"


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def launches(k, sizes, rounds: int) -> tuple[list[str], float]:
    """The one-shot table, and the seconds the forkserver's first launch took (template start included)."""
    times = {(m, n): [] for m in METHODS for n in sizes}
    first = _timed(k, "%%distributed -n 2 --start-method forkserver\nx = rank")
    for n in sizes:
        for m in METHODS:
            _timed(k, f"%%distributed -n {n} --start-method {m}\nx = rank")  # warm-up
        for r in range(rounds):
            order = METHODS if r % 2 == 0 else tuple(reversed(METHODS))
            for m in order:
                times[(m, n)].append(_timed(k, f"%%distributed -n {n} --start-method {m}\nx = rank"))
            note(f"N={n} round {r + 1}/{rounds}: " + ", ".join(f"{m} {times[(m, n)][-1] * 1e3:.0f} ms" for m in order))
    rows = [
        "| start method | N | end to end (ms) | vs fork |",
        "|---|---|---|---|",
    ]
    for n in sizes:
        fork = statistics.median(times[("fork", n)])
        for m in METHODS:
            med = statistics.median(times[(m, n)])
            rows.append(f"| {m} | {n} | {med * 1e3:.0f} | {med / fork:.2f}x |")
    return rows, first


def live_starts(k, rounds: int) -> list[str]:
    got = {"fork": [], "forkserver": []}
    for r in range(rounds):
        for m in ("fork", "forkserver") if r % 2 == 0 else ("forkserver", "fork"):
            got[m].append(_timed(k, f"%distributed_start -n 2 --start-method {m}"))
            _timed(k, "%distributed_stop")
    fork = statistics.median(got["fork"])
    return [
        "| live session start (`%distributed_start -n 2`) | median (ms) | vs fork |",
        "|---|---|---|",
        *(f"| {m} | {statistics.median(v) * 1e3:.0f} | {statistics.median(v) / fork:.2f}x |" for m, v in got.items()),
    ]


def live_round_trip(k, cells: int) -> list[str]:
    _timed(k, "%distributed_start -n 2")
    _timed(k, "%%distributed\nimport torch, torch.distributed as dist\nt = torch.ones(1)")
    kinds = {
        "plain kernel cell `x = 1`": "x = 1",
        "live `x = 1`": "%%distributed\nx = 1",
        "live `all_reduce`": ALL_REDUCE,
    }
    got = {name: [] for name in kinds}
    for _ in range(3):
        for code in kinds.values():
            _timed(k, code)  # warm-up
    for i in range(cells):
        names = list(kinds) if i % 2 == 0 else list(reversed(kinds))
        for name in names:
            got[name].append(_timed(k, kinds[name]))
    _timed(k, "%distributed_stop")
    plain = statistics.median(got["plain kernel cell `x = 1`"])
    return [
        "| cell | median (ms) | vs plain cell |",
        "|---|---|---|",
        *(f"| {name} | {_ms(v)} | {statistics.median(v) / plain:.2f}x |" for name, v in got.items()),
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--before", metavar="PATH", help="another checkout whose %%load_ext time is measured too")
    a = ap.parse_args()
    sizes, rounds, cells, starts = ((2,), 3, 15, 2) if a.quick else ((2, 4), 9, 50, 5)
    adopt_orphans()
    load0 = os.getloadavg()
    k = start_kernel()
    try:
        _timed(k, "%load_ext kernelside\nfrom kernelside.engines import forkserver")
        note("one-shot launches")
        table, first = launches(k, sizes, rounds)
        pid = int(k.run("print(forkserver.running_template().pid)").ok().stdout)
        rss, pss = _rss_bytes(pid), pss_bytes(pid)
        note("live session starts")
        starts_table = live_starts(k, starts)
        note("live round trip")
        trip = live_round_trip(k, cells)
    finally:
        k.shutdown()
    deadline = time.monotonic() + 5.0  # the template sees its kernel gone (a pidfd) and exits with its ranks
    while descendants() and time.monotonic() < deadline:
        time.sleep(0.05)
    left = descendants()
    stop_tree()
    before_trip = None
    if a.before:
        note(f"live round trip on {a.before}")
        k = start_kernel(pythonpath=a.before)
        try:
            _timed(k, "%load_ext kernelside")
            before_trip = live_round_trip(k, cells)
        finally:
            k.shutdown()
        time.sleep(2.0)
        stop_tree()
    note("%load_ext kernelside")
    load_ext = load_ext_seconds(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    before = load_ext_seconds(a.before) if a.before else None
    load1 = os.getloadavg()
    lines = [
        heading(
            "Forkserver and live cells",
            "forkserver",
            a.quick,
            f"medians of {rounds} interleaved launches per method and of {cells} interleaved cells",
            flags=f" --before {a.before}" if a.before else "",
        ),
        "",
        f"Load average {load0[0]:.1f} before and {load1[0]:.1f} after, on {os.cpu_count()} cores (anything "
        "else running on the machine counts in it).",
        "",
        "One-shot `%%distributed -n N --start-method M` of `x = rank`, end to end as the notebook sees the cell:",
        "",
        *table,
        "",
        f"The forkserver's first launch, which starts its template (a fresh interpreter importing torch): "
        f"{first:.2f} s. The idle template: RSS {rss / 2**20:.0f} MiB, PSS {pss / 2**20:.0f} MiB.",
        "",
        *starts_table,
        "",
        "Live round trip on 2 ranks (fork), interleaved with a plain cell in the same kernel:",
        "",
        *trip,
        "",
        *(
            [
                f"The same on `{a.before}` (the code before this change), in a kernel of its own right after:",
                "",
                *before_trip,
                "",
            ]
            if before_trip
            else []
        ),
        f"`%load_ext kernelside` (torch already imported), median of 3 fresh kernels: {load_ext:.3f} s"
        + (f", {before:.3f} s for `{a.before}`." if before is not None else "."),
    ]
    if left:
        lines.append(f"\nLeft running 5 s after the kernel's shutdown (stopped by pid): {left}")
    write_result("forkserver", a.quick, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
