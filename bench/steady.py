"""Steady-state DDP training throughput under each launcher, side by side in one run.

    python -m bench.steady            # N = 2 and 4 (300 / 150 timed steps), median of 4 runs per cell
    python -m bench.steady --quick    # N = 2, 200 timed steps, 1 run, no waiting for a quiet machine

The same function runs everywhere: DDP over a small MLP (64 -> 256 -> 256 -> 1) on a fixed
synthetic batch of 64 per rank, gloo on CPU, 30 warm-up steps, then a barrier, the timed steps,
and a barrier; rank 0 reports steps/s from inside the worker, so launch cost is not counted.
Launchers: nblaunch (fork, spawn), torchrun, Accelerate's notebook_launcher. The "chatty" variant
has rank 0 print one line per step (flushed, as a live log would be) and update a ``progress()``
bar (under nblaunch in the mode a Jupyter kernel sets, widgets events; elsewhere tqdm text on
stderr). Every launcher's output goes to a file, so no terminal is in the loop.

Two rates per run: wall (timed steps / timed span) and typical step (1 / the median duration of one
step on rank 0; DDP's all_reduce makes a step wait for the slowest rank, so this is the whole job's
step). Other load on the machine preempts some steps and makes them outliers: the median step
ignores them, the wall rate does not. Rank 0's CPU time per step (all its threads, gloo's included)
is shown too.

Other people's work on a shared machine moves wall-clock figures by far more than the 2 % at stake:
before each launch the script waits (up to 30 s) for a second in which other processes use under
0.25 cores, measures what they used during the launch (/proc/stat minus this process tree), and runs
a disturbed launch again (twice at most; every attempt is a sample, labelled); 2 minutes of such
waiting and reruns at most per run of the script. Even undisturbed, a run on this 2-vCPU virtual
machine varies by about +-8 % from the next, more than the 2 % at stake: the ratio to torchrun comes
with a 90 % bootstrap interval (resampling each launcher's runs), and the verdict, on the typical
step, says whether the runs can tell.

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
import random
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

from bench.harness import (
    REPO,
    ForeignLoad,
    adopt_orphans,
    descendants,
    free_port,
    heading,
    median,
    note,
    stop_tree,
    torchrun_cmd,
    wait_until_quiet,
    write_result,
)

WARMUP = 30
THREADS = 1
# Other work on the machine (other people's tests) moves steps/s by far more than 2 %: each launch
# waits for a quiet second first, and one that others disturbed anyway is run again.
QUIET_CORES = 0.25
QUIET_WAIT_S = 30
RETRIES = 2
PATIENCE_S = 120  # at most this much extra time per run of the script, after which launches just run


def ratio_interval(ours: list[float], ref: list[float], reps: int = 4000) -> tuple[float, float]:
    """90 % bootstrap interval of median(ours) / median(ref), resampling each side's runs."""
    rng = random.Random(0)
    rs = sorted(
        statistics.median(rng.choices(ours, k=len(ours))) / statistics.median(rng.choices(ref, k=len(ref)))
        for _ in range(reps)
    )
    return rs[int(0.05 * reps)], rs[int(0.95 * reps) - 1]


def train(steps: int, chatty: bool, threads: int, result_path: str) -> None:
    """One DDP run; rank 0 writes {"steps_per_s", "median_steps_per_s", "cpu_ms_per_step", "threads", "omp"}."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from kernelside import progress, worker_context

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
        worker_context().progress_render = "widgets"  # what a Jupyter kernel sets (nblaunch only)
        bar = progress(total=steps, desc="train")
    dist.barrier()
    t0, c0 = time.perf_counter(), time.process_time()
    ends = []
    for i in range(steps):
        loss = step()
        if bar is not None:
            print(f"step {i} loss {loss.item():.5f}", flush=True)
            bar.update(1)
        ends.append(time.perf_counter())
    dist.barrier()
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    durations = [b - a for a, b in zip([t0, *ends[:-1]], ends, strict=True)]
    if bar is not None:
        bar.close()
    if rank == 0:
        with open(result_path, "w") as fh:
            json.dump(
                {
                    "steps_per_s": steps / elapsed,
                    "median_steps_per_s": 1 / statistics.median(durations),
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
    ap.add_argument("--runs", type=int, default=4)
    ns = ap.parse_args()
    adopt_orphans()
    sizes, runs = ((2,), 1) if ns.quick else ((2, 4), ns.runs)
    retries = 0 if ns.quick else RETRIES  # a smoke run does not wait for a quiet machine
    spent = [0.0]  # seconds spent waiting for quiet and on reruns, bounded by PATIENCE_S

    def patience_left() -> float:
        return PATIENCE_S - spent[0]

    steps_for = {2: 200} if ns.quick else {2: 300, 4: 150}  # about 1 s timed per run on 2 cores
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
                    tries = []
                    for attempt in range(1 + (retries if patience_left() > 0 else 0)):
                        result = os.path.join(tmp, f"r{r}-{n}-{variant}-{name.replace(' ', '_')}-{attempt}.json")
                        log = os.path.join(tmp, f"{name.replace(' ', '_')}.log")
                        if retries and patience_left() > 0:
                            t_wait = time.monotonic()
                            wait_until_quiet(QUIET_CORES, max_wait=min(QUIET_WAIT_S, patience_left()))
                            spent[0] += time.monotonic() - t_wait
                        with ForeignLoad() as load:
                            fn(n, (steps_for[n], chatty, THREADS, result), log)
                        with open(result) as fh:
                            tries.append({**json.load(fh), "foreign": load.cores})
                        left = descendants()
                        if left:
                            leaks.append((name, left))
                            stop_tree()
                        if load.cores < QUIET_CORES or patience_left() <= 0 or attempt == retries:
                            break
                        spent[0] += load.seconds  # this launch is run again
                    cells.setdefault((n, variant, name), []).extend(tries)  # every attempt is a sample
                    note(
                        f"run {r + 1}/{runs} N={n} {variant} {name}: "
                        + ", ".join(
                            f"{t['steps_per_s']:.1f} steps/s (others used {t['foreign']:.2f} cores)" for t in tries
                        )
                    )

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
        "per step and updates a `progress()` bar. *Typical step*: 1 / the median duration of a step on rank 0 "
        "(a step that another process preempted is an outlier there, not in the median); *wall*: steps / the "
        "whole timed span. Both are medians over the runs; the interval is a 90 % bootstrap interval of the ratio. "
        "*Others' load*: CPU that other processes used during the launches (median; each launch first waited for "
        f"a quiet second and a disturbed one was run again, up to {retries} times, every attempt a sample).",
        "",
        "| N | variant | launcher | steps/s, typical step | vs torchrun | 90 % interval | steps/s, wall | "
        "vs torchrun | rank 0 CPU ms/step | others' load (cores) | runs | threads |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    verdicts = []
    for n in sizes:
        for variant in variants:
            ref = cells[(n, variant, "torchrun")]
            ref_typ = [c["median_steps_per_s"] for c in ref]
            ref_wall = median(c["steps_per_s"] for c in ref)
            for name in launchers:
                samples = cells[(n, variant, name)]
                typ = [c["median_steps_per_s"] for c in samples]
                wall = median(c["steps_per_s"] for c in samples)
                ratio = median(typ) / median(ref_typ)
                lo, hi = ratio_interval(typ, ref_typ)
                lines.append(
                    f"| {n} | {variant} | {name} | {median(typ):.1f} | {ratio:.2f}x | {lo:.2f}-{hi:.2f} | {wall:.1f} | "
                    f"{wall / ref_wall:.2f}x | {median(c['cpu_ms_per_step'] for c in samples):.2f} | "
                    f"{median(c['foreign'] for c in samples):.2f} | {len(samples)} | "
                    f"{','.join(map(str, sorted({c['threads'] for c in samples})))} |"
                )
                if name.startswith("nblaunch"):
                    verdicts.append((ratio, lo, hi, f"{name} N={n} {variant}"))
    if all(v[1] >= 0.98 for v in verdicts):
        met = "met (every interval lies above 0.98x)"
    elif all(v[0] >= 0.98 for v in verdicts):
        met = "met on the medians, though some intervals reach below 0.98x (the runs cannot rule out a small loss)"
    elif all(v[2] >= 0.98 for v in verdicts):
        met = "NOT shown: some medians are below 0.98x, but every interval reaches 0.98x (within run-to-run noise)"
    else:
        met = "NOT met: some intervals lie entirely below 0.98x"
    lines += [
        "",
        f"Target: nblaunch >= 0.98x torchrun — {met}. Typical step: "
        f"{'; '.join(f'{c} {v:.2f}x ({lo:.2f}-{hi:.2f})' for v, lo, hi, c in verdicts)}.",
    ]
    lines.append(f"\nWaiting for a quiet machine and rerunning disturbed launches took {spent[0]:.0f} s of this run.")
    if leaks:
        lines.append(f"\nProcesses left behind (then stopped): {leaks}.")
    write_result("steady", ns.quick, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
