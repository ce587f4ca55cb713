"""Issue 34's benchmarks on a GPU machine (the H200 of the GPU kit): launches, live cells and results at 2, 4, 8.

    python -m bench.gpu_ranks                  # every part, about 3 minutes on one H200 machine
    python -m bench.gpu_ranks --quick          # fewer launches and cells
    python -m bench.gpu_ranks --budget-s 60    # start no part past 60 s (tests/gpu/on_device.sh passes one)

Without a CUDA device it refuses at once with one line and exit status 1: its figures would be this
machine's CPU benches (``bench.launch_ranks``, ``bench.live_ranks``, ``bench.results_path``), which run anywhere.

On the GPU machine, in this order (each part is skipped, and says so, once the budget is spent):

1. **results**: a 256 MiB CUDA tensor made on rank 0 and brought back with ``--return`` (the rank moves it to
   CPU; it comes back through shared memory) against the same cell without ``--return`` and a pickle round
   trip of the same tensor on CPU in the kernel; and a 256 MiB tensor pushed into 2 live ranks;
2. **live cells**: ``bench.live_ranks``' plain ``x = 1``, live ``x = 1`` and live ``all_reduce`` at 2, 4 and 8
   live ranks (gloo, one GPU shared), plus a live cell whose ``all_reduce`` is of a CUDA tensor;
3. **launches**: ``bench.launch_ranks`` (nblaunch's ``notebook_launcher`` against Accelerate's) with the GPU
   hidden (``CUDA_VISIBLE_DEVICES=``): Accelerate's launcher puts rank N on GPU N, which one GPU cannot hold;
   what it gives is the same comparison on a quiet machine with many cores, which the shared 2-core machine
   cannot.

Writes bench/results/gpu_ranks.md and prints it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from bench import live_ranks
from bench.harness import REPO, adopt_orphans, gpus_described, heading, note, run_cell, start_kernel, write_result

NO_CUDA = "no CUDA device: bench.gpu_ranks needs a GPU (bench.launch_ranks, live_ranks and results_path run without)"
SIZES = (2, 4, 8)
CUDA_ALL_REDUCE = (
    "%%distributed\nimport torch, torch.distributed as dist\nt = torch.ones(1, device=device)\ndist.all_reduce(t)"
)
N = 256 << 20


def _cuda_count() -> int:
    import torch

    return torch.cuda.device_count()


def _t(k, code: str, timeout: float = 600) -> float:
    t0 = time.perf_counter()
    run_cell(k, code, timeout=timeout)
    return time.perf_counter() - t0


def results_part(runs: int) -> list[str]:
    """A CUDA tensor's way back, and a push into live ranks, in one kernel."""
    k = start_kernel()
    try:
        run_cell(k, "%load_ext kernelside\nimport pickle, time, torch", timeout=120)
        make = f"x = torch.ones({N} // 4, device='cuda')"
        back = f"%%distributed -n 2 --backend gloo --return x\nimport torch\n{make}\ntorch.cuda.synchronize()"
        kept = f"%%distributed -n 2 --backend gloo\nimport torch\n{make}\ntorch.cuda.synchronize()"
        local = f"y = torch.ones({N} // 4)\nt0 = time.perf_counter(); pickle.loads(pickle.dumps(y, protocol=5))"
        got = {"back": [], "kept": [], "pickle": []}
        _t(k, kept)  # warm-up: the ranks' CUDA contexts
        for _ in range(runs):
            got["back"].append(_t(k, back))
            got["kept"].append(_t(k, kept))
            run_cell(k, local, timeout=120)
            got["pickle"].append(float(k.run("print(time.perf_counter() - t0)").stdout))
        med = {key: statistics.median(v) for key, v in got.items()}
        way = med["back"] - med["kept"]
        run_cell(k, "%distributed_start -n 2 --backend gloo", timeout=300)
        pushes = []
        for i in range(runs):
            run_cell(k, f"big = torch.full(({N} // 4,), {i}.0)", timeout=120)
            pushes.append(_t(k, "%distributed_push big"))
        run_cell(k, "%distributed_stop", timeout=120)
        return [
            "| what (256 MiB) | time | pickle round trip in the kernel | ratio |",
            "|---|---|---|---|",
            f"| a CUDA tensor's way back (`--return` less without) | {way:.3f} s | {med['pickle']:.3f} s | "
            f"{way / med['pickle']:.2f}x |",
            f"| `%distributed_push` into 2 live ranks | {statistics.median(pushes):.3f} s | {med['pickle']:.3f} s | "
            f"{statistics.median(pushes) / med['pickle']:.2f}x |",
        ]
    finally:
        k.shutdown()


def live_part(cells: int) -> list[str]:
    kinds = {**live_ranks.KINDS, "live `all_reduce` of a CUDA tensor": CUDA_ALL_REDUCE}
    results, loads = live_ranks.run_all({"now": REPO}, SIZES, cells, flags="--backend gloo", kinds=kinds)
    return [
        "| ranks | cell | median (ms) | vs plain cell | target | load average after |",
        "|---|---|---|---|---|---|",
        *live_ranks.rows(SIZES, results["now"], loads),
    ]


def launch_part(runs: int, budget_s: float) -> list[str]:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    run = subprocess.run(
        [sys.executable, "-m", "bench.launch_ranks", "--runs", str(runs)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=max(budget_s, 30),
    )
    if run.returncode != 0:
        return [f"bench.launch_ranks failed (exit status {run.returncode}):", "", "```", run.stderr[-2000:], "```"]
    return [line for line in run.stdout.splitlines() if not line.startswith("written to")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2 runs, 10 cells, 2 launches per size")
    ap.add_argument("--budget-s", type=float, default=600.0, help="start no part after this many seconds")
    ns = ap.parse_args()
    if _cuda_count() == 0:
        print(NO_CUDA, file=sys.stderr)
        return 1
    adopt_orphans()
    t0 = time.monotonic()
    runs, cells = (2, 10) if ns.quick else (3, 30)
    parts = [
        ("Results through shared memory", lambda: results_part(runs)),
        ("Live cells against a plain cell (gloo, one GPU shared)", lambda: live_part(cells)),
        (
            "A one-shot launch, nblaunch against Accelerate, GPU hidden (CPU, gloo)",
            lambda: launch_part(runs, ns.budget_s - (time.monotonic() - t0)),
        ),
    ]
    lines = [
        heading(
            "Issue 34's benchmarks on a GPU machine",
            "gpu_ranks",
            ns.quick,
            f"{runs} runs, {cells} cells per kind, {os.cpu_count()} cores",
            accel=gpus_described(),
            flags=f" --budget-s {ns.budget_s:g}",
        ),
        "",
    ]
    for title, part in parts:
        spent = time.monotonic() - t0
        lines += [f"## {title}", ""]
        if spent > ns.budget_s:
            lines += [f"Skipped: {spent:.0f} s of the {ns.budget_s:.0f} s budget were spent before it.", ""]
            continue
        note(title)
        try:
            lines += part()
        except Exception as e:  # one part's failure must not cost the others' figures
            lines.append(f"Failed: {type(e).__name__}: {e}")
        lines += ["", f"Load average {os.getloadavg()[0]:.1f} after it.", ""]
    write_result("gpu_ranks", ns.quick, "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
