"""What a live cell costs the CPU, thread by thread, against a plain cell, in one kernel per checkout (issue 34).

    python -m bench.live_cpu                      # 2 and 8 live ranks, 300 cells of each kind
    python -m bench.live_cpu --before ../main     # also another checkout, in a kernel of its own, interleaved

On 2 cores a live cell is bound by the CPU its processes use, and a median of wall times moves with whatever else
the machine does; CPU time read from the scheduler (``/proc/<pid>/task/<tid>/schedstat``, no profiler) moves far
less. For each size N a live session of N ranks (fork, gloo) is started in each kernel; then, in blocks of 20, a
live ``x = 1`` cell and a plain ``x = 1`` cell alternate, kernel by kernel. Per cell (means over the blocks): the
kernel's main thread, its other threads (IOPub, heartbeat, the store), every thread of every rank, and the wall time
as a notebook sees it.

Writes bench/results/live_cpu.md.
"""

from __future__ import annotations

import argparse
import os
import time

from bench.harness import adopt_orphans, cell_stdout, heading, note, run_cell, start_kernel, stop_tree, write_result

BLOCK = 20
KINDS = {"live": "%%distributed\nx = 1", "plain": "x = 1"}


def _threads_ns(pid: int) -> dict[int, int]:
    """CPU nanoseconds of each thread of ``pid`` so far."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
                out[int(tid)] = int(fh.read().split()[0])
        except OSError:
            pass  # (a thread that ended meanwhile)
    return out


def _sample(kernel_pid: int, rank_pids: list[int]) -> tuple[int, int, int]:
    """(the kernel's main thread, its other threads, every rank thread): CPU ns so far."""
    kernel = _threads_ns(kernel_pid)
    main = kernel.pop(kernel_pid, 0)
    return main, sum(kernel.values()), sum(sum(_threads_ns(p).values()) for p in rank_pids)


def _pids(k, n: int) -> tuple[int, list[int]]:
    kernel_pid = int(cell_stdout(run_cell(k, "import os\nprint(os.getpid())", timeout=60)))
    run_cell(k, "%%distributed --return-from all --return _pid\nimport os\n_pid = os.getpid()", timeout=60)
    ranks = [int(p) for p in cell_stdout(run_cell(k, "print(*_pid)", timeout=60)).split()]
    assert len(ranks) == n, ranks
    return kernel_pid, ranks


def measure(sources: dict, n: int, cells: int) -> dict:
    """``{label: {kind: [main ns, other ns, ranks ns, wall s]}}`` summed over ``cells`` cells of each kind."""
    kernels = {label: start_kernel(pythonpath=path) for label, path in sources.items()}
    try:
        pids = {}
        for label, k in kernels.items():
            run_cell(k, "%load_ext kernelside", timeout=120)
            run_cell(k, f"%distributed_start -n {n}", timeout=300)
            pids[label] = _pids(k, n)
            for _ in range(20):  # warm-up
                for code in KINDS.values():
                    run_cell(k, code, timeout=60)
        got = {label: {kind: [0, 0, 0, 0.0] for kind in KINDS} for label in sources}
        for _ in range(max(1, cells // BLOCK)):
            for label, k in kernels.items():
                for kind, code in KINDS.items():
                    before, t0 = _sample(*pids[label]), time.perf_counter()
                    for _ in range(BLOCK):
                        run_cell(k, code, timeout=60)
                    wall, after = time.perf_counter() - t0, _sample(*pids[label])
                    acc = got[label][kind]
                    for i in range(3):
                        acc[i] += after[i] - before[i]
                    acc[3] += wall
        for k in kernels.values():
            run_cell(k, "%distributed_stop", timeout=120)
        return got
    finally:
        for k in kernels.values():
            k.shutdown()
        left = stop_tree()
        if left:
            note(f"stopped {len(left)} process(es) left after the kernels: {left}")


def rows(n: int, label: str, got: dict, cells: int) -> str:
    live, plain = ([v / cells for v in got[kind]] for kind in KINDS)
    us = 1e-3  # ns -> µs
    return (
        f"| {n} | {label} | {live[0] * us:.0f} | {plain[0] * us:.0f} | {(live[0] - plain[0]) * us:.0f} | "
        f"{(live[1] - plain[1]) * us:.0f} | {live[2] * us:.0f} | {live[3] * 1e3:.2f} / {plain[3] * 1e3:.2f} "
        f"({live[3] / plain[3]:.2f}x) |"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", default="2,8", help="comma-separated numbers of live ranks (default 2,8)")
    ap.add_argument("--cells", type=int, default=300, help=f"cells of each kind per size, in blocks of {BLOCK}")
    ap.add_argument("--before", metavar="PATH", help="another checkout, in a kernel of its own, block by block")
    a = ap.parse_args()
    adopt_orphans()
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sources = {"now": here, **({"before": os.path.abspath(a.before)} if a.before else {})}
    cells = max(1, a.cells // BLOCK) * BLOCK
    load = os.getloadavg()[0]
    table = [
        "| ranks | code | kernel main thread, live cell (µs) | plain cell (µs) | live − plain (µs) | "
        "kernel's other threads, live − plain (µs) | ranks, all threads (µs) | wall, live / plain (ms) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n in (int(s) for s in a.sizes.split(",")):
        note(f"{n} live ranks, {cells} cells of each kind in each of {', '.join(sources)}")
        got = measure(sources, n, cells)
        for label in sources:
            table.append(rows(n, label, got[label], cells))
            note("  " + table[-1])
    flags = f" --sizes {a.sizes} --cells {a.cells}" + (f" --before {a.before}" if a.before else "")
    how = f"fork, gloo, means over {cells} cells of each kind in blocks of {BLOCK}, load average {load:.1f} at start"
    title = heading("A live cell's CPU, thread by thread", "live_cpu", False, how, flags=flags)
    text = "\n".join([title, "", *table, ""])
    write_result("live_cpu", False, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
