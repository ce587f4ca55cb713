"""Output flood: rank 0 prints 200,000 lines as fast as it can. How long, and does every line arrive, in order?

    python -m bench.flood            # 200,000 lines, median of 3 runs, then the same in a real kernel
    python -m bench.flood --quick    # 50,000 lines, 1 run, kernel part included

Part 1, in this process: nblaunch (2 workers, fork) with a capturing object as ``sys.stdout`` during
the call; every line it receives is checked against what rank 0 printed, in order. Reference: the
same loop in a plain torch.multiprocessing worker whose stdout is /dev/null, line-buffered as
nblaunch's worker stdout is (so both make one write() per line; the difference is the pipe and the
kernel-side routing). Reported: the loop's time inside rank 0, and the whole call.

Part 2, in a real Jupyter kernel (tests/kernel.py): the same launch from a cell, and the same loop
run in the kernel itself without workers. From the cell's iopub ``stream`` messages: lines received
(and in order), message count, the largest single message, and the stream's bytes per second —
set against jupyter_server's default ``iopub_data_rate_limit`` (1,000,000 bytes/s averaged over 3 s),
above which a browser session drops output.

Writes bench/results/flood.md and prints it.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import textwrap
import time

from bench.harness import (
    adopt_orphans,
    cell_stdout,
    descendants,
    free_port,
    heading,
    median,
    note,
    run_cell,
    start_kernel,
    write_result,
)

JUPYTER_SERVER_RATE_LIMIT = 1_000_000  # bytes/s, ZMQChannelsWebsocketConnection.iopub_data_rate_limit default


def line(i: int) -> str:
    return f"line {i:06d} of the flood: the quick brown fox"


def flood(n: int) -> float | None:
    """Rank 0 prints ``n`` lines; returns the seconds its loop took (None on other ranks)."""
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_rank() != 0:
        return None
    t0 = time.perf_counter()
    for i in range(n):
        print(f"line {i:06d} of the flood: the quick brown fox")
    sys.stdout.flush()
    return time.perf_counter() - t0


def plain_worker(rank: int, world: int, port: int, n: int, queue) -> None:
    """The reference: a torch.multiprocessing worker printing into /dev/null, line-buffered."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    sys.stdout = open(os.devnull, "w", buffering=1)
    took = flood(n)
    if rank == 0:
        queue.put(took)
    dist.destroy_process_group()


class Capture(io.TextIOBase):
    """What the caller's sys.stdout receives: every write, as it came."""

    def __init__(self):
        self.chunks: list[str] = []

    def write(self, s: str) -> int:
        self.chunks.append(s)
        return len(s)

    def flush(self) -> None:
        pass


def check_lines(text: str, n: int) -> tuple[int, bool]:
    """(flood lines shown, every line accounted for in order).

    nblaunch budgets what a cell shows: lines over the budget are held back and counted in
    "[nblaunch: N line(s) not shown here ...]" notes, and the last 20 are shown at the end. So the
    check is: the shown lines are the first line, then increasing, ending with the last line, and
    shown + held back - the 20 repeated at the end == n (or all n shown when nothing was held back).
    """
    lines = text.splitlines()
    got = [ln for ln in lines if ln.startswith("line ")]
    held = sum(int(ln.split()[1]) for ln in lines if ln.startswith("[nblaunch: ") and "not shown here" in ln)
    if not held:
        return len(got), got == [line(i) for i in range(n)]
    idx = [int(ln.split()[1]) for ln in got]
    ordered = idx[0] == 0 and idx[-1] == n - 1 and all(a < b for a, b in zip(idx, idx[1:], strict=False))
    return len(got), ordered and len(got) - 20 + held == n


def run_nblaunch(n: int) -> dict:
    from kernelside import last_report, notebook_launcher

    cap = Capture()
    saved, sys.stdout = sys.stdout, cap
    t0 = time.perf_counter()
    try:
        loop_s = notebook_launcher(flood, args=(n,), num_processes=2, start_method="fork")
    finally:
        sys.stdout = saved
    call_s = time.perf_counter() - t0
    received, in_order = check_lines("".join(cap.chunks), n)
    return {
        "loop_s": loop_s,
        "call_s": call_s,
        "received": received,
        "in_order": in_order,
        "writes": len(cap.chunks),
        "largest_write": max((len(c) for c in cap.chunks), default=0),
        "log_lines": sum(1 for _ in open(last_report().ranks[0].log_path)),
    }


def run_plain(n: int) -> dict:
    import torch.multiprocessing as mp

    ctx = mp.get_context("fork")
    q = ctx.SimpleQueue()
    t0 = time.perf_counter()
    mp.start_processes(plain_worker, args=(2, free_port(), n, q), nprocs=2, start_method="fork")
    call_s = time.perf_counter() - t0
    return {"loop_s": q.get(), "call_s": call_s}


KERNEL_SETUP = textwrap.dedent("""\
    import sys, time, json
    sys.path.insert(0, {repo!r})
    from bench.flood import flood
    from kernelside import notebook_launcher
    notebook_launcher(flood, args=(10,), num_processes=2)  # warm-up: the first launch imports torch._dynamo
    """)
KERNEL_CELLS = {
    "nblaunch, 2 workers": "notebook_launcher(flood, args=({n},), num_processes=2)",
    "the same loop in the kernel (no workers)": "flood({n})",
}


def kernel_rows(n: int) -> list[dict]:
    from bench.harness import REPO

    rows = []
    k = start_kernel()
    try:
        run_cell(k, KERNEL_SETUP.format(repo=REPO), timeout=120)
        for where, call in KERNEL_CELLS.items():
            code = (
                f"_t0 = time.perf_counter(); _loop = {call.format(n=n)}; "
                "print('RESULT', json.dumps([_loop, time.perf_counter() - _t0]))"
            )
            t0 = time.perf_counter()
            msgs = run_cell(k, code, timeout=600)
            seen_s = time.perf_counter() - t0
            streams = [c["text"] for kind, c in msgs if kind == "stream" and c["name"] == "stdout"]
            text = cell_stdout(msgs)
            loop_s, cell_s = json.loads(text.strip().splitlines()[-1].split(" ", 1)[1])
            received, in_order = check_lines(text, n)
            sizes = [len(s.encode()) for s in streams]
            rows.append(
                {
                    "where": where,
                    "loop_s": loop_s,
                    "cell_s": cell_s,
                    "seen_s": seen_s,
                    "received": received,
                    "in_order": in_order,
                    "messages": len(streams),
                    "largest": max(sizes),
                    "bytes": sum(sizes),
                }
            )
            note(f"kernel {where}: {rows[-1]}")
    finally:
        k.shutdown()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="50,000 lines, 1 run")
    ap.add_argument("--runs", type=int, default=3)
    ns = ap.parse_args()
    adopt_orphans()
    n, runs = (50_000, 1) if ns.quick else (200_000, ns.runs)

    run_nblaunch(100)  # warm-up: the first nblaunch fork launch imports torch._dynamo in this process
    ours, plain = [], []
    for r in range(runs):
        ours.append(run_nblaunch(n))
        plain.append(run_plain(n))
        note(f"run {r + 1}/{runs}: nblaunch {ours[-1]}; plain /dev/null {plain[-1]}")
    krows = kernel_rows(n)
    left = descendants()

    ref = median(p["loop_s"] for p in plain)
    loop = median(o["loop_s"] for o in ours)
    all_ok = all(o["in_order"] for o in ours)
    lines = [
        heading(
            "Output flood",
            "flood",
            ns.quick,
            f"{n:,} lines of {len(line(0)) + 1} bytes from rank 0, median of {runs} run(s)",
        ),
        "",
        "In this process, `sys.stdout` replaced by a capturing object during the call:",
        "",
        "| launcher | rank 0's loop (s) | loop vs /dev/null | whole call (s) | lines shown | all accounted, in order | "
        "writes to sys.stdout | largest write (chars) |",
        "|---|---|---|---|---|---|---|---|",
        f"| nblaunch fork, 2 workers | {loop:.3f} | {loop / ref:.2f}x | {median(o['call_s'] for o in ours):.3f} | "
        f"{min(o['received'] for o in ours):,} | {'yes' if all_ok else 'NO'} | "
        f"{median(o['writes'] for o in ours):,.0f} | {max(o['largest_write'] for o in ours):,} |",
        f"| torch.multiprocessing fork, stdout = /dev/null (line-buffered) | {ref:.3f} | 1.00x | "
        f"{median(p['call_s'] for p in plain):.3f} | - | - | - | - |",
        "",
        "In a real Jupyter kernel, from the cell's iopub `stream` messages (*seen*: until the cell went idle, "
        "as the client saw it):",
        "",
        "| where | loop (s) | cell (s) | seen (s) | lines shown | all accounted, in order | stream messages | "
        "largest message (bytes) | stream bytes/s over a 3 s window | vs jupyter_server's default limit |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in krows:
        rate = r["bytes"] / max(r["seen_s"], 3.0)  # jupyter_server averages over a 3 s window
        lines.append(
            f"| {r['where']} | {r['loop_s']:.3f} | {r['cell_s']:.3f} | {r['seen_s']:.3f} | {r['received']:,} | "
            f"{'yes' if r['in_order'] else 'NO'} | {r['messages']:,} | {r['largest']:,} | "
            f"{rate:,.0f} | {rate / JUPYTER_SERVER_RATE_LIMIT:.1f}x |"
        )
    lines += [
        "",
        f"Every line in order: {'yes' if all_ok and all(r['in_order'] for r in krows) else 'NO'} "
        f"(rank 0's log file had {ours[-1]['log_lines']:,} lines in the last run).",
    ]
    if left:
        lines.append(f"\nProcesses left behind: {left}.")
    write_result("flood", ns.quick, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
