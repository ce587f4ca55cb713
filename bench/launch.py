"""Launch cost: nblaunch side by side with what users would use instead, in one run.

    python -m bench.launch            # full run (N = 2 and 4, 5 measured runs each + the kernel DDP cell)
    python -m bench.launch --quick    # N = 2, 2 runs, no kernel part (a smoke run)

Measured for each launcher, as medians over the runs after one warm-up launch:
- start-up: from the call until every rank runs user code with the process group up;
- end to end: the whole call for a trivial function (init, barrier, return).
Launchers: nblaunch (fork, forkserver: forked from a template process that holds torch, spawn),
torch.multiprocessing.start_processes (fork, spawn) with the
process-group set-up written by hand, torchrun on an equivalent script, and Accelerate's
notebook_launcher when installed.

Then, in a real Jupyter kernel: a function that builds DDP(nn.Linear(16, 1)) and runs 300
steps over a DistributedSampler on 2 workers, launched 3 times in a row by nblaunch and by
Accelerate's notebook_launcher (each in a fresh kernel), once with the first launch right after
``%load_ext kernelside`` (or Accelerate's import) and once 10 s after it, as when a user runs the
cells above the launch first. The time ``%load_ext kernelside`` takes is measured in the same
kernels (``--before PATH`` adds it for another checkout, e.g. the commit before a change).

Writes bench/results/launch.md (the table the README quotes) and prints it.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

from bench.harness import free_port, mark_ready, ready_times, torchrun_cmd

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")


def trivial_nblaunch(outdir):
    import torch.distributed as dist

    mark_ready(outdir, dist.get_rank())
    dist.barrier()
    return 0


def trivial_by_hand(local_rank, world_size, port, outdir):
    """What a user writes for torch.multiprocessing: the process-group set-up is theirs."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=local_rank, world_size=world_size)
    mark_ready(outdir, local_rank)
    dist.barrier()
    dist.destroy_process_group()


def trivial_env(outdir):
    """For launchers that only set RANK/WORLD_SIZE/MASTER_* (Accelerate's notebook_launcher, torchrun)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo")
    mark_ready(outdir, dist.get_rank())
    dist.barrier()
    dist.destroy_process_group()


TORCHRUN_SCRIPT = textwrap.dedent("""\
    import os, sys, time
    import torch.distributed as dist
    dist.init_process_group("gloo")
    with open(os.path.join(sys.argv[1], f"ready{dist.get_rank()}"), "w") as fh:
        fh.write(repr(time.time()))
    dist.barrier()
    dist.destroy_process_group()
    """)


def run_nblaunch(n, outdir, method):
    from kernelside import notebook_launcher

    notebook_launcher(trivial_nblaunch, args=(outdir,), num_processes=n, start_method=method, output="none")


def run_mp(n, outdir, method):
    import torch.multiprocessing as mp

    mp.start_processes(trivial_by_hand, args=(n, free_port(), outdir), nprocs=n, start_method=method)


def run_torchrun(n, outdir, script):
    subprocess.run(
        torchrun_cmd(n, script, outdir),
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def run_accelerate(n, outdir):
    from accelerate import notebook_launcher

    notebook_launcher(trivial_env, args=(outdir,), num_processes=n, use_port=str(free_port()))


def measure(fn, n: int, runs: int) -> tuple[float, float]:
    """(median start-up, median end-to-end) over ``runs`` launches after one warm-up."""
    starts, totals = [], []
    for i in range(runs + 1):
        outdir = tempfile.mkdtemp(prefix="nblaunch-bench-")
        t0 = time.time()
        fn(n, outdir)
        t1 = time.time()
        ready = ready_times(outdir, n)
        if i > 0:
            starts.append(max(ready) - t0)
            totals.append(t1 - t0)
    return statistics.median(starts), statistics.median(totals)


KERNEL_SETUP = textwrap.dedent("""\
    import time, socket
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
    from torch.nn.parallel import DistributedDataParallel as DDP
    X, Y = torch.randn(300 * 2 * 8, 16), torch.randn(300 * 2 * 8, 1)
    def ddp_300_steps():
        import torch.distributed as dist
        if not dist.is_initialized():
            dist.init_process_group("gloo")
        model = DDP(nn.Linear(16, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        loader = DataLoader(TensorDataset(X, Y), batch_size=8, sampler=DistributedSampler(TensorDataset(X, Y)))
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad(); loss.backward(); opt.step()
        return loss.item()
    def free_port():
        s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p
    """)

KERNEL_LAUNCH = {
    "nblaunch": "t0 = time.perf_counter()\n%load_ext kernelside\nprint(time.perf_counter() - t0)\n"
    "from kernelside import notebook_launcher\nlaunch = lambda: notebook_launcher(ddp_300_steps, num_processes=2)",
    "accelerate": "from accelerate import notebook_launcher\nlaunch = lambda: notebook_launcher(ddp_300_steps, "
    "num_processes=2, use_port=str(free_port()))",
}


def kernel_ddp_cell(which: str, launches: int = 3, delay: float = 0.0) -> list[float]:
    """Seconds per launch; for nblaunch, the last entry is the time ``%load_ext kernelside`` took."""
    sys.path.insert(0, os.path.join(REPO, "tests"))
    from kernel import Kernel

    k = Kernel()
    try:
        k.run(KERNEL_SETUP).ok()
        loaded = k.run(KERNEL_LAUNCH[which]).ok()
        if delay:
            k.run(f"time.sleep({delay})").ok()  # the user runs the cells above the launch
        times = []
        for _ in range(launches):
            cell = k.run("t0 = time.perf_counter(); launch(); print(time.perf_counter() - t0)", timeout=300).ok()
            times.append(float(cell.stdout.strip().splitlines()[-1]))
        if which == "nblaunch":
            times.append(float(loaded.stdout.strip().splitlines()[-1]))
        return times
    finally:
        k.shutdown()


def load_ext_seconds(repo: str, runs: int = 3) -> float:
    """Median time of ``%load_ext kernelside`` (torch already imported) in fresh kernels on ``repo``'s code."""
    sys.path.insert(0, os.path.join(REPO, "tests"))
    from kernel import Kernel

    times = []
    for _ in range(runs):
        k = Kernel(pythonpath=repo)
        try:
            k.run("import time, torch").ok()
            cell = k.run("t0 = time.perf_counter()\n%load_ext kernelside\nprint(time.perf_counter() - t0)").ok()
            times.append(float(cell.stdout.strip().splitlines()[-1]))
        finally:
            k.shutdown()
    return statistics.median(times)


def kernel_table(have_accelerate: bool, before: str | None) -> list[str]:
    ours = {d: kernel_ddp_cell("nblaunch", delay=d) for d in (0.0, 10.0)}
    theirs = {d: kernel_ddp_cell("accelerate", delay=d) for d in (0.0, 10.0)} if have_accelerate else None
    lines = [
        "",
        "DDP(nn.Linear(16, 1)), 300 steps over a DistributedSampler, 2 workers, launched 3 times in a "
        "row from one real Jupyter kernel (seconds per launch); the first launch right after `%load_ext "
        "kernelside` (or Accelerate's import), and 10 s after it:",
        "",
        "| launcher | 1st at once | 1st after 10 s | 2nd | 3rd | 1st at once vs Accelerate's | "
        "1st after 10 s vs Accelerate's | 2nd+3rd vs Accelerate |",
        "|---|---|---|---|---|---|---|---|",
    ]
    row = (
        lambda name, t0, t10, acc0, acc10: (  # noqa: E731
            f"| {name} | {t0[0]:.2f} | {t10[0]:.2f} | {t10[1]:.2f} | {t10[2]:.2f} | "
            f"{t0[0] / acc0[0]:.2f}x | {t10[0] / acc10[0]:.2f}x | "
            f"{statistics.mean(t10[1:3]) / statistics.mean(acc10[1:3]):.2f}x |"
        )
    )
    if theirs:
        lines.append(row("nblaunch notebook_launcher", ours[0.0], ours[10.0], theirs[0.0], theirs[10.0]))
        lines.append(row("accelerate notebook_launcher", theirs[0.0], theirs[10.0], theirs[0.0], theirs[10.0]))
    else:
        lines.append(f"| nblaunch notebook_launcher | {ours[0.0][0]:.2f} | {ours[10.0][0]:.2f} | | | | | |")
    lines += [
        "",
        f"`%load_ext kernelside` (torch already imported), median of 3 fresh kernels: "
        f"{load_ext_seconds(REPO):.3f} s here",
    ]
    if before:
        lines[-1] += f", {load_ext_seconds(before):.3f} s for `{before}`"
    lines[-1] += "."
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="N=2, 2 runs, skip the kernel DDP cell")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--before", metavar="PATH", help="another checkout whose %%load_ext time is measured too")
    ns = ap.parse_args()
    sizes, runs = ((2,), 2) if ns.quick else ((2, 4), ns.runs)
    script = os.path.join(tempfile.mkdtemp(prefix="nblaunch-bench-"), "trivial.py")
    with open(script, "w") as fh:
        fh.write(TORCHRUN_SCRIPT)
    try:
        import accelerate  # noqa: F401

        have_accelerate = True
    except ImportError:
        have_accelerate = False
    launchers = {
        "nblaunch fork": lambda n, d: run_nblaunch(n, d, "fork"),
        "nblaunch forkserver": lambda n, d: run_nblaunch(n, d, "forkserver"),
        "nblaunch spawn": lambda n, d: run_nblaunch(n, d, "spawn"),
        "torch.multiprocessing fork": lambda n, d: run_mp(n, d, "fork"),
        "torch.multiprocessing spawn": lambda n, d: run_mp(n, d, "spawn"),
        "torchrun": lambda n, d: run_torchrun(n, d, script),
    }
    if have_accelerate:
        launchers["accelerate notebook_launcher"] = run_accelerate
    rows = {}
    for n in sizes:
        for name, fn in launchers.items():
            rows[(name, n)] = measure(fn, n, runs)
            print(
                f"N={n} {name}: start-up {rows[(name, n)][0]:.3f}s, end to end {rows[(name, n)][1]:.3f}s",
                file=sys.stderr,
            )
    lines = [
        f"Launch cost, {datetime.date.today()}, {platform.machine()} with {os.cpu_count()} cores, CPU/gloo, "
        f"median of {runs} runs after a warm-up launch (`python -m bench.launch{' --quick' if ns.quick else ''}`)."
        "",
        "",
        "| launcher | N | start-up (s) | end to end (s) | end to end vs mp fork | vs torchrun |",
        "|---|---|---|---|---|---|",
    ]
    for n in sizes:
        mp_fork, trun = rows[("torch.multiprocessing fork", n)][1], rows[("torchrun", n)][1]
        for name in launchers:
            s, e = rows[(name, n)]
            lines.append(f"| {name} | {n} | {s:.3f} | {e:.3f} | {e / mp_fork:.2f}x | {e / trun:.2f}x |")
    if not ns.quick:
        lines += kernel_table(have_accelerate, ns.before)
    text = "\n".join(lines) + "\n"
    os.makedirs(RESULTS, exist_ok=True)
    out = os.path.join(RESULTS, "launch-quick.md" if ns.quick else "launch.md")
    with open(out, "w") as fh:
        fh.write(text)
    print(text)
    print(f"written to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
