"""Steady-state DDP training throughput under each launcher, side by side in one run.

    python -m bench.steady            # N = 2 and 4 (400 / 200 timed steps), median of 3 runs per cell
    python -m bench.steady --quick    # N = 2, 200 timed steps, 1 run

The same function runs everywhere: DDP over a small MLP (64 -> 256 -> 256 -> 1) on a fixed
synthetic batch of 64 per rank, gloo on CPU, 30 warm-up steps, then a barrier, the timed steps,
and a barrier; rank 0 reports steps/s from inside the worker, so launch cost is not counted.
Launchers: nblaunch (fork, spawn), torchrun, Accelerate's notebook_launcher. The "chatty" variant
has rank 0 print one line per step (flushed, as a live log would be) and update a ``progress()``
bar (under nblaunch in the mode a Jupyter kernel sets, widgets events; elsewhere tqdm text on
stderr). Every launcher's output goes to a file, so no terminal is in the loop.

Besides steps/s (wall clock, which other load on the machine disturbs), rank 0's CPU time per timed
step (all its threads, gloo's included) is reported: it shows a launcher's own per-step cost, if any,
with less noise.

Threads are made equal: OMP_NUM_THREADS is set to the same value for every launcher and every worker
calls ``torch.set_num_threads()`` with it (torchrun would choose 1, nblaunch cpu_count // N); the
table shows what each worker actually ran with. Runs are interleaved across launchers.

Writes bench/results/steady.md and prints it. Target (issue 6): nblaunch >= 0.98x torchrun.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time

from bench.harness import (
    REPO,
    adopt_orphans,
    descendants,
    free_port,
    heading,
    median,
    note,
    stop_tree,
    torchrun_cmd,
    write_result,
)

WARMUP = 30
THREADS = 1


def train(steps: int, chatty: bool, threads: int, result_path: str) -> None:
    """One DDP run; rank 0 writes {"steps_per_s", "cpu_ms_per_step", "threads", "omp"} to ``result_path``."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from kernelside import progress

    if not dist.is_initialized():  # torchrun and Accelerate leave this to the user
        dist.init_process_group("gloo")
    torch.set_num_threads(threads)
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(rank)
    x, y = torch.randn(64, 64, generator=gen), torch.randn(64, 1, generator=gen)

    def step():
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    for _ in range(WARMUP):
        step()
    bar = None
    if chatty and rank == 0:
        os.environ["NBLAUNCH_PROGRESS_RENDER"] = "widgets"  # what a Jupyter kernel sets (nblaunch only)
        bar = progress(total=steps, desc="train")
    dist.barrier()
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(steps):
        loss = step()
        if bar is not None:
            print(f"step {i} loss {loss.item():.5f}", flush=True)
            bar.update(1)
    dist.barrier()
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    if bar is not None:
        bar.close()
    if rank == 0:
        with open(result_path, "w") as fh:
            json.dump(
                {
                    "steps_per_s": steps / elapsed,
                    "cpu_ms_per_step": cpu / steps * 1e3,
                    "threads": torch.get_num_threads(),
                    "omp": os.environ.get("OMP_NUM_THREADS"),
                },
                fh,
            )


TORCHRUN_SCRIPT = textwrap.dedent("""\
    import sys
    from bench.steady import train
    train(int(sys.argv[1]), sys.argv[2] == "1", int(sys.argv[3]), sys.argv[4])
    """)


@contextlib.contextmanager
def output_to(path: str):
    """fds 1 and 2 of this process (inherited by forked workers) and sys.stdout/err go to ``path``."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (fd, *saved):
            os.close(f)


def run_nblaunch(method, n, args, log):
    from kernelside import notebook_launcher

    with output_to(log):
        notebook_launcher(train, args=args, num_processes=n, start_method=method)


def run_accelerate(n, args, log):
    from accelerate import notebook_launcher

    with output_to(log):
        notebook_launcher(train, args=args, num_processes=n, use_port=str(free_port()))


def run_torchrun(script, n, args, log):
    steps, chatty, threads, result = args
    cmd = torchrun_cmd(n, script, str(steps), "1" if chatty else "0", str(threads), result)
    env = {**os.environ, "PYTHONPATH": REPO}
    with open(log, "ab") as fh:
        subprocess.run(cmd, check=True, stdout=fh, stderr=fh, env=env, timeout=300)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="N=2, 200 steps, 1 run")
    ap.add_argument("--runs", type=int, default=3)
    ns = ap.parse_args()
    adopt_orphans()
    sizes, runs = ((2,), 1) if ns.quick else ((2, 4), ns.runs)
    steps_for = {2: 200} if ns.quick else {2: 400, 4: 200}  # 1-2 s timed per run on 2 cores
    os.environ["OMP_NUM_THREADS"] = str(THREADS)  # the same for every launcher (torchrun keeps a set value)
    tmp = tempfile.mkdtemp(prefix="nblaunch-bench-steady-")
    script = os.path.join(tmp, "train.py")
    with open(script, "w") as fh:
        fh.write(TORCHRUN_SCRIPT)
    launchers = {
        "nblaunch fork": lambda n, a, log: run_nblaunch("fork", n, a, log),
        "nblaunch spawn": lambda n, a, log: run_nblaunch("spawn", n, a, log),
        "torchrun": lambda n, a, log: run_torchrun(script, n, a, log),
        "accelerate notebook_launcher": run_accelerate,
    }
    variants = {"quiet": False, "chatty": True}
    # warm-up: the first nblaunch fork launch imports torch._dynamo in this process, once
    run_nblaunch("fork", 2, (5, False, THREADS, os.path.join(tmp, "warm.json")), os.path.join(tmp, "warm.log"))
    cells: dict[tuple, list[dict]] = {}
    leaks = []
    for r in range(runs):
        for n in sizes:
            for variant, chatty in variants.items():
                for name, fn in launchers.items():
                    result = os.path.join(tmp, f"r{r}-{n}-{variant}-{name.replace(' ', '_')}.json")
                    log = os.path.join(tmp, f"{name.replace(' ', '_')}.log")
                    fn(n, (steps_for[n], chatty, THREADS, result), log)
                    with open(result) as fh:
                        cells.setdefault((n, variant, name), []).append(json.load(fh))
                    left = descendants()
                    if left:
                        leaks.append((name, left))
                        stop_tree()
                    got = cells[(n, variant, name)][-1]
                    note(f"run {r + 1}/{runs} N={n} {variant} {name}: {got['steps_per_s']:.1f} steps/s")

    lines = [
        heading(
            "Steady-state DDP throughput",
            "steady",
            ns.quick,
            f"median of {runs} interleaved run(s), "
            + ", ".join(f"{s} timed steps at N={n}" for n, s in steps_for.items())
            + f" after {WARMUP} warm-up steps",
        ),
        "",
        f"Threads made equal: OMP_NUM_THREADS={THREADS} for every launcher and `torch.set_num_threads({THREADS})` in "
        "every worker (column *threads*: what rank 0 ran with). Quiet: no output. Chatty: rank 0 prints one line "
        "per step and updates a `progress()` bar.",
        "",
        "| N | variant | launcher | steps/s (median) | vs torchrun | best run | best vs torchrun's best | "
        "spread (min-max) | rank 0 CPU ms/step | threads |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    verdicts = []
    for n in sizes:
        for variant in variants:
            ref = median(c["steps_per_s"] for c in cells[(n, variant, "torchrun")])
            ref_best = max(c["steps_per_s"] for c in cells[(n, variant, "torchrun")])
            for name in launchers:
                got = [c["steps_per_s"] for c in cells[(n, variant, name)]]
                sps, best = median(got), max(got)
                threads = {c["threads"] for c in cells[(n, variant, name)]}
                cpu = median(c["cpu_ms_per_step"] for c in cells[(n, variant, name)])
                lines.append(
                    f"| {n} | {variant} | {name} | {sps:.1f} | {sps / ref:.2f}x | {best:.1f} | "
                    f"{best / ref_best:.2f}x | {min(got):.0f}-{max(got):.0f} | {cpu:.2f} | "
                    f"{','.join(map(str, sorted(threads)))} |"
                )
                if name.startswith("nblaunch"):
                    verdicts.append((sps / ref, best / ref_best, f"{name} N={n} {variant}"))
    worst = min(verdicts)
    met = "met" if worst[0] >= 0.98 else "NOT met"
    lines += [
        "",
        f"Target: nblaunch >= 0.98x torchrun — {met} on medians (lowest: {worst[0]:.2f}x, {worst[2]}; "
        f"all nblaunch cells: {', '.join(f'{v:.2f}x' for v, _, _ in verdicts)}; best runs: "
        f"{', '.join(f'{b:.2f}x' for _, b, _ in verdicts)}).",
    ]
    if leaks:
        lines.append(f"\nProcesses left behind (then stopped): {leaks}.")
    write_result("steady", ns.quick, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
