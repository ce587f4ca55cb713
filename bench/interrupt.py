"""From ■ to the cell's end: a plain cell, nblaunch (one-shot and live) and Accelerate's notebook_launcher, quiet and
with two busy processes beside it, in one run.

    python -m bench.interrupt            # 5 interrupts per row
    python -m bench.interrupt --quick    # 2 per row, quiet only

In one real kernel per launcher, ■ (the kernel interrupt JupyterLab sends) is pressed while:
- a plain cell sleeps (the floor: what a local kernel costs);
- a one-shot launch's ranks wait in a collective (rank 1 sleeps, rank 0 sits in ``barrier``), under fork and spawn;
- a one-shot launch's ranks train (a DDP model, a progress bar in the cell);
- a one-shot launch starts (the first ■ as its display appears, then four more within a second: a storm);
- a live cell's ranks wait in a collective (the ranks keep their state);
- Accelerate's ``notebook_launcher`` ranks wait in the same collective.
Measured: seconds from the first press to the cell's end (median, max), and whether it ended with a
``KeyboardInterrupt`` within 30 s. Target (issue 27): 2 s on a quiet machine for nblaunch.

Writes bench/results/interrupt.md and prints it.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

from bench.harness import REPO, BusyProcesses, heading, median, note, start_kernel, write_result

CAP_S = 30.0
SETUP = """
import time, torch.distributed as dist
def in_collective():
    if not dist.is_initialized():  # Accelerate's launcher sets the environment only; nblaunch's group is up
        dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        time.sleep(60)
    print("waiting", flush=True)
    dist.barrier()
def quick():
    return 1
def training():
    import torch
    from kernelside import progress
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in progress(range(10**6), desc="train"):
        if step == 20:
            print("waiting", flush=True)
        loss = model(torch.randn(32, 64)).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
"""
NB = "%load_ext kernelside\nfrom kernelside import notebook_launcher\n" + SETUP
ACC = "from accelerate import notebook_launcher\nfrom bench.harness import free_port\n" + SETUP
LIVE_CELL = "%%distributed\nif rank == 1:\n    time.sleep(60)\nprint('waiting', flush=True)\ndist.barrier()"

# row -> (kernel setup, code, the mark after which ■ comes, presses)
ROWS = {
    "plain cell, time.sleep": ("import time", "print('waiting', flush=True); time.sleep(60)", "waiting", 1),
    "nblaunch, fork, ranks in a collective": (NB, "notebook_launcher(in_collective, num_processes=2)", "waiting", 1),
    "nblaunch, spawn, ranks in a collective": (
        NB,
        "notebook_launcher(in_collective, num_processes=2, start_method='spawn')",
        "waiting",
        1,
    ),
    "nblaunch, fork, ranks training (DDP, a progress bar)": (
        NB,
        "notebook_launcher(training, num_processes=2)",
        "waiting",
        1,
    ),
    "nblaunch, fork, a storm as the ranks start": (NB, "notebook_launcher(quick, num_processes=2)", "display", 5),
    "nblaunch, live cell, ranks in a collective": (NB + "\n%distributed_start -n 2", LIVE_CELL, "waiting", 1),
    "Accelerate notebook_launcher, ranks in a collective": (
        ACC,
        "notebook_launcher(in_collective, num_processes=2, use_port=str(free_port()))",
        "waiting",
        1,
    ),
}


def _press_after_mark(k, code: str, mark: str, presses: int) -> tuple[float | None, bool]:
    """Run ``code``; at the first output that is ``mark`` (a text, or "display" for the run's display) press ■
    ``presses`` times within a second. (seconds from the first press to the cell's end or None past CAP_S,
    whether it ended with a KeyboardInterrupt)."""
    from kernel import Cell

    pressed, fire, done = [], threading.Event(), threading.Event()

    def presser():
        if not fire.wait(120) or done.is_set():
            return
        for i in range(presses):
            if i and done.wait(1.0 / presses):
                return
            pressed.append(time.monotonic())
            k.interrupt()

    def on_message(kind, content):
        if mark == "display" and kind == "display_data" or kind == "stream" and mark in content.get("text", ""):
            fire.set()

    thread = threading.Thread(target=presser, daemon=True)
    thread.start()
    cell = Cell()
    cell.msg_id = k.kc.execute(code)
    try:
        k.wait(cell, 120, on_message=on_message)
    except TimeoutError:  # (the kernel is restarted for the next run)
        return None, False
    finally:
        done.set()
        fire.set()
        thread.join()
    if not pressed:
        return None, False
    took = time.monotonic() - pressed[0]
    ended_short = cell.error is not None and cell.error["ename"] == "KeyboardInterrupt"
    return (took if took <= CAP_S else None), ended_short


def measure(row: str, runs: int) -> tuple[list[float], int, int]:
    setup, code, mark, presses = ROWS[row]
    times, short, hung = [], 0, 0
    k = start_kernel(cwd=REPO)
    try:
        k.run(setup, timeout=300).ok()
        for _ in range(runs):
            took, ended_short = _press_after_mark(k, code, mark, presses)
            if took is None:
                hung += 1
                k.shutdown()
                k = start_kernel(cwd=REPO)
                k.run(setup, timeout=300).ok()
                continue
            times.append(took)
            short += ended_short
    finally:
        k.shutdown()
    return times, short, hung


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    sys.path.insert(0, os.path.join(REPO, "tests"))
    runs = 2 if a.quick else 5
    loads = (0,) if a.quick else (0, 2)
    lines = [
        heading(
            "From ■ to the cell's end",
            "interrupt",
            a.quick,
            f"{runs} interrupts per row, quiet and with two busy processes beside it, cap {CAP_S:g} s",
        ),
        "",
        "| what ■ interrupts | busy processes | median | max | ended with KeyboardInterrupt | did not end in 30 s |",
        "|---|---|---|---|---|---|",
    ]
    for busy in loads:
        with BusyProcesses(busy):
            for row in ROWS:
                note(f"{row}, {busy} busy...")
                times, short, hung = measure(row, runs)
                med = f"{median(times):.2f} s" if times else "—"
                top = f"{max(times):.2f} s" if times else "—"
                lines.append(f"| {row} | {busy} | {med} | {top} | {short}/{runs} | {hung}/{runs} |")
    write_result("interrupt", a.quick, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
