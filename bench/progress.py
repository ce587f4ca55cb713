"""Progress bars in a worker: cost per iteration, and how many messages reach the kernel.

    python -m bench.progress            # 1e6 iterations, 9 rounds; 3 s per scenario; 1000 epochs
    python -m bench.progress --quick    # 1e6 iterations, 3 rounds; 1 s per scenario; 100 epochs

Part 1, in one nblaunch worker (rank 0 of 2, fork), rounds interleaved so drift hits every row alike:
a loop of 1e6 empty iterations, bare, through ``progress()`` in the mode a Jupyter kernel sets
(``progress_render`` "widgets" in the rank's context: throttled events to the kernel), through ``progress()`` in
text mode (tqdm on stderr), and through ``tqdm(file=/dev/null)``. Overhead per iteration is
(loop time - bare loop time) / 1e6, median over the rounds.

Part 2, one launch per scenario: ``last_report().event_counts["progress"]`` divided by how long the
scenario ran in the worker — what the kernel has to absorb. Scenarios: one bar over a tight loop;
the same with ``set_postfix()`` every iteration; an epoch bar with a short inner bar
(``leave=False``) created anew for every epoch.

Part 3, in a real Jupyter kernel: one bar over a tight loop, and an epoch bar with an inner bar
per epoch, launched on 2 workers vs run in the kernel itself with tqdm.notebook; the iopub widget
messages of the cell and the widget models left alive in the kernel afterwards.

Writes bench/results/progress.md and prints it. Target (issue 4): overhead per iteration no more
than tqdm's.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import textwrap
import time

from bench.harness import (
    adopt_orphans,
    cell_stdout,
    descendants,
    heading,
    median,
    note,
    run_cell,
    start_kernel,
    write_result,
)

N_ITERS = 1_000_000
MODES = ("bare", "progress() widgets", "progress() text", "tqdm(file=/dev/null)")


def _loop(mode: str, n: int, devnull) -> float:
    from tqdm.std import tqdm

    from kernelside import progress, worker_context

    if mode == "bare":
        it = range(n)
    elif mode == "tqdm(file=/dev/null)":
        it = tqdm(range(n), file=devnull)
    else:
        worker_context().progress_render = "widgets" if "widgets" in mode else "text"
        it = progress(range(n), desc="bench")
    t0 = time.perf_counter()
    for _ in it:
        pass
    return time.perf_counter() - t0


def overhead_rounds(n: int, rounds: int):
    """In the worker: {mode: [seconds per loop]} over interleaved rounds (rank 0 only)."""
    import torch.distributed as dist

    if dist.get_rank() != 0:
        return None
    times = {m: [] for m in MODES}
    with open(os.devnull, "w") as devnull:
        # sys.stderr of the worker is a pipe to the kernel: text bars there are what a terminal user gets
        for _ in range(rounds):
            for mode in MODES:
                times[mode].append(_loop(mode, n, devnull))
    return times


def scenario(name: str, seconds: float):
    """In the worker: run one message-rate scenario for ``seconds``; return (duration, bars created)."""
    import torch.distributed as dist

    from kernelside import progress, worker_context

    if dist.get_rank() != 0:
        return None
    worker_context().progress_render = "widgets"  # what a Jupyter kernel sets
    t0 = time.perf_counter()
    end = t0 + seconds
    bars = 1
    if name == "tight loop":
        bar = progress(total=None, desc="tight")
        while time.perf_counter() < end:
            bar.update(1)
        bar.close()
    elif name == "set_postfix every iteration":
        bar = progress(total=None, desc="postfix")
        i = 0
        while time.perf_counter() < end:
            i += 1
            bar.update(1)
            bar.set_postfix(loss=1.0 / i)
        bar.close()
    elif name.startswith("epoch bar + inner bar"):
        work_s = 1e-4 if "0.1 ms" in name else 0.0
        outer = progress(total=None, desc="epoch")
        while time.perf_counter() < end:
            for _ in progress(range(50), desc="batch", leave=False):
                _busy(work_s)
            bars += 1
            outer.update(1)
        outer.close()
    else:
        raise ValueError(name)
    return time.perf_counter() - t0, bars


SCENARIOS = (
    "tight loop",
    "set_postfix every iteration",
    "epoch bar + inner bar per epoch (50 items × 0.1 ms)",
    "epoch bar + inner bar per epoch (50 empty items)",
)


def _busy(seconds: float) -> None:
    if seconds:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass


KERNEL_SETUP = textwrap.dedent("""\
    import json, time
    from kernelside import notebook_launcher, progress
    from ipywidgets.widgets import widget as _widget
    def nested(epochs, inner=50):
        t0 = time.perf_counter()
        for _ in progress(range(epochs), desc="epoch"):
            for _ in progress(range(inner), desc="batch", leave=False):
                pass
        return time.perf_counter() - t0
    def tight(seconds):
        t0 = time.perf_counter()
        bar = progress(total=None, desc="tight")
        while time.perf_counter() < t0 + seconds:
            bar.update(1)
        bar.close()
        return time.perf_counter() - t0
    notebook_launcher(tight, args=(0.1,), num_processes=2)  # warm-up: the first launch imports torch._dynamo
    """)

KERNEL_CELL = (
    "_n0 = len(_widget._instances); _t0 = time.perf_counter(); _r = {call}; "
    "print(json.dumps([_r, time.perf_counter() - _t0, len(_widget._instances) - _n0]))"
)


def kernel_rows(epochs: int, seconds: float) -> list[tuple]:
    """In a real kernel: (case, where, worker loop s, cell s, comm_open, comm_msg, comm_close, widgets left)."""
    rows = []
    k = start_kernel()
    try:
        run_cell(k, KERNEL_SETUP, timeout=120)
        cases = [
            (f"one bar, tight loop for {seconds:g} s", "tight", f"({seconds},)"),
            (f"epoch bar + inner bar (50 empty items) x {epochs} epochs", "nested", f"({epochs},)"),
        ]
        for case, fn, args in cases:
            for where, call in (
                ("nblaunch, 2 workers", f"notebook_launcher({fn}, args={args}, num_processes=2)"),
                ("tqdm.notebook in the kernel (no workers)", f"{fn}(*{args})"),
            ):
                msgs = run_cell(k, KERNEL_CELL.format(call=call), timeout=600)
                counts = collections.Counter(kind for kind, _ in msgs)
                loop_s, cell_s, widgets = json.loads(cell_stdout(msgs).strip().splitlines()[-1])
                row = (
                    case,
                    where,
                    loop_s,
                    cell_s,
                    counts["comm_open"],
                    counts["comm_msg"],
                    counts["comm_close"],
                    widgets,
                )
                note(f"kernel: {row}")
                rows.append(row)
    finally:
        k.shutdown()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="3 rounds, 1 s per scenario, 100 epochs in the kernel")
    ns = ap.parse_args()
    adopt_orphans()
    rounds, seconds, epochs = (3, 1.0, 100) if ns.quick else (9, 3.0, 1000)

    from kernelside import last_report, notebook_launcher

    notebook_launcher(overhead_rounds, args=(1000, 1), num_processes=2, start_method="fork", output="none")  # warm-up
    times = notebook_launcher(
        overhead_rounds, args=(N_ITERS, rounds), num_processes=2, start_method="fork", output="none"
    )
    loop_s = {m: median(v) for m, v in times.items()}
    # overhead per round (against that round's bare loop), then the median and the best round
    over = {m: [(t - b) / N_ITERS * 1e9 for t, b in zip(times[m], times["bare"], strict=True)] for m in MODES}
    per_iter = {m: median(v) for m, v in over.items()}
    best = {m: min(v) for m, v in over.items()}
    for m in MODES:
        note(f"{m}: {loop_s[m] * 1e3:.1f} ms per loop, overhead {per_iter[m]:.1f} ns/it (best {best[m]:.1f})")

    rates = {}
    for name in SCENARIOS:
        duration, bars = notebook_launcher(
            scenario, args=(name, seconds), num_processes=2, start_method="fork", output="none"
        )
        events = last_report().event_counts.get("progress", 0)
        rates[name] = (events, duration, bars)
        note(f"{name}: {events} progress events in {duration:.2f}s ({events / duration:.1f}/s), {bars} bars")
    krows = kernel_rows(epochs, seconds)
    left = descendants()
    if left:
        note(f"left behind: {left}")

    tq = per_iter["tqdm(file=/dev/null)"]
    lines = [
        heading("Progress bar cost in a worker", "progress", ns.quick, f"median of {rounds} interleaved rounds"),
        "",
        f"A loop of {N_ITERS:,} empty iterations on rank 0 of an nblaunch launch (2 workers, fork):",
        "",
        "| loop | time per loop (ms) | overhead per iteration (ns) | best round (ns) | vs tqdm(file=/dev/null) |",
        "|---|---|---|---|---|",
    ]
    for m in MODES:
        if m == "bare":
            lines.append(f"| {m} | {loop_s[m] * 1e3:.1f} | - | - | - |")
        else:
            lines.append(
                f"| {m} | {loop_s[m] * 1e3:.1f} | {per_iter[m]:.1f} | {best[m]:.1f} | {per_iter[m] / tq:.2f}x |"
            )
    lines += [
        "",
        "Progress events reaching the kernel (`last_report().event_counts['progress']` / time the scenario ran "
        "in the worker; a bar sends at most one event per 0.1 s plus one when it opens and one when it closes):",
        "",
        "| scenario | seconds | bars | events | events/s | events/s per open bar |",
        "|---|---|---|---|---|---|",
    ]
    for name, (events, duration, bars) in rates.items():
        lines.append(
            f"| {name} | {duration:.2f} | {bars} | {events} | {events / duration:.1f} | "
            f"{events / duration / min(bars, 2):.1f} |"
        )
    lines += [
        "",
        "In a real Jupyter kernel (jupyter_client, as a notebook would run it): the same code launched on 2 workers "
        "vs run in the kernel itself with tqdm.notebook (what `progress()` is outside a launch); iopub widget "
        "messages the cell sent, and widget models still alive in the kernel after the cell:",
        "",
        "| case | where | loop in worker/kernel (s) | whole cell (s) | comm_open | comm_msg | comm_close | "
        "widgets left |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for case, where, loop_s, cell_s, opened, msgs, closed, widgets in krows:
        lines.append(f"| {case} | {where} | {loop_s:.2f} | {cell_s:.2f} | {opened} | {msgs} | {closed} | {widgets} |")
    w = per_iter["progress() widgets"]
    # paired by round: the rounds interleave the loops, so a round's load hits both alike
    cheaper = sum(a <= b for a, b in zip(over["progress() widgets"], over["tqdm(file=/dev/null)"], strict=True))
    spread = max(over["tqdm(file=/dev/null)"]) - min(over["tqdm(file=/dev/null)"])
    met = "met" if w <= tq else f"NOT met by {w - tq:.1f} ns ({(w / tq - 1) * 100:.0f}%)"
    lines += [
        "",
        f"Target: overhead per iteration no more than tqdm's — {met} (median {w:.1f} ns vs {tq:.1f} ns, "
        f"{w / tq:.2f}x; `progress()` cost no more than tqdm in {cheaper} of {rounds} rounds; tqdm's own "
        f"overhead varied by {spread:.1f} ns between rounds).",
    ]
    if left:
        lines.append(f"\nProcesses left behind after the launches: {left}.")
    write_result("progress", ns.quick, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
