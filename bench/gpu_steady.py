"""Steady-state DDP training of a small transformer on the GPUs: nblaunch fork against torchrun, in paired runs.

    python -m bench.gpu_steady              # 4 pairs after a warm-up pair, 300 timed steps (sized for ~1.5 min)
    python -m bench.gpu_steady --quick      # 2 pairs, 100 timed steps
    python -m bench.gpu_steady --smoke-cpu  # a tiny model on CPU with gloo, 1 pair: a rehearsal, never a figure
    python -m bench.gpu_steady --ranks-per-gpu 2 --pairs 2 --steps 20 --warmup 5   # two ranks per card, gloo

The model is transformers' GPT-2 built from a config, no weights (6 layers, width 512, 8 heads, context
256, vocabulary 8192: about 27M parameters), trained with DDP (NCCL, one rank per GPU), AdamW and bf16
autocast on a fixed synthetic batch of 16 x 256 tokens per rank. 20 warm-up steps, then the timed steps
between CUDA synchronizations and barriers; rank 0 reports steps/s from inside the worker, so launch
cost is not counted. OMP_NUM_THREADS=1 for both launchers (what torchrun picks for several ranks).

Runs are paired: a pair is one nblaunch launch and one torchrun launch back to back, the order flipping
from pair to pair, so drift of the machine hits both sides alike. Each pair gives the ratio nblaunch /
torchrun; the table gives the median ratio with a 95 % bootstrap interval over the pairs. The script
starts no pair that would end after ``--budget-s`` and says how many pairs it ran.

With ``--ranks-per-gpu K`` (K > 1) K ranks share each card and the process group is gloo (NCCL takes one
rank per GPU): nblaunch picks gloo itself for more ranks than GPUs, and the torchrun script is told to.
Rank r computes on cuda:(r mod GPUs) under both.

Writes bench/results/gpu_steady.md (gpu_steady-shared.md with --ranks-per-gpu above 1, gpu_steady-smoke-cpu.md
for --smoke-cpu) and prints it.
"""

from __future__ import annotations

import argparse
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
    bootstrap_median_interval,
    descendants,
    gpus_described,
    heading,
    median,
    note,
    stop_tree,
    torchrun_cmd,
    write_result,
)

MODEL = {"n_layer": 6, "n_embd": 512, "n_head": 8, "n_positions": 256, "vocab_size": 8192}
MODEL_SMOKE = {"n_layer": 1, "n_embd": 64, "n_head": 2, "n_positions": 32, "vocab_size": 256}
BATCH = 16
WARMUP = 20


def train(steps: int, result_path: str, smoke: bool, backend: str = "nccl", warmup: int = WARMUP) -> None:
    """One DDP run; rank 0 writes {"steps_per_s", "params", "start_method"} to ``result_path``."""
    import os

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from transformers import GPT2Config, GPT2LMHeadModel

    cuda = not smoke
    if not dist.is_initialized():  # torchrun leaves this to the script
        dist.init_process_group(backend if cuda else "gloo")
    rank, local = dist.get_rank(), int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        local %= torch.cuda.device_count()  # several ranks per card: rank r on cuda:(r mod GPUs)
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    cfg = MODEL_SMOKE if smoke else MODEL
    torch.manual_seed(0)
    model = DDP(GPT2LMHeadModel(GPT2Config(**cfg)).to(device), device_ids=[local] if cuda else None)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator(device=device).manual_seed(rank)
    ids = torch.randint(0, cfg["vocab_size"], (BATCH, cfg["n_positions"]), device=device, generator=gen)

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    def meet():
        if cuda:
            torch.cuda.synchronize()
            dist.barrier(device_ids=[local]) if dist.get_backend() == "nccl" else dist.barrier()
        else:
            dist.barrier()

    for _ in range(warmup):
        step()
    meet()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    meet()
    elapsed = time.perf_counter() - t0
    if rank == 0:
        with open(result_path, "w") as fh:
            json.dump({"steps_per_s": steps / elapsed, "params": sum(p.numel() for p in model.parameters())}, fh)


TORCHRUN_SCRIPT = textwrap.dedent("""\
    import sys
    from bench.gpu_steady import train
    train(int(sys.argv[1]), sys.argv[2], sys.argv[3] == "1", sys.argv[4], int(sys.argv[5]))
    """)


def run_nblaunch(n: int, steps: int, result: str, smoke: bool, log: str, backend: str, warmup: int) -> str:
    from kernelside import last_report, notebook_launcher

    with open(log, "a") as fh:
        fh.write("--- nblaunch ---\n")
    args = (steps, result, smoke, backend, warmup)
    notebook_launcher(train, args=args, num_processes=n, start_method="fork", output="none")
    rep = last_report()
    return f"{rep.start_method}/{rep.backend}"


def run_torchrun(n: int, steps: int, result: str, smoke: bool, log: str, script: str, backend: str, warmup: int) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)}
    with open(log, "ab") as fh:
        fh.write(b"--- torchrun ---\n")
        fh.flush()
        cmd = torchrun_cmd(n, script, str(steps), result, "1" if smoke else "0", backend, str(warmup))
        subprocess.run(cmd, check=True, stdout=fh, stderr=fh, env=env, timeout=180)
    return "torchrun"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2 pairs, 100 timed steps")
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--budget-s", type=float, default=100.0, help="start no pair that would end after this")
    ap.add_argument("--warmup", type=int, default=WARMUP, help="untimed steps before the timed ones")
    ap.add_argument("--ranks-per-gpu", type=int, default=1, help="above 1: that many ranks share each card, gloo")
    ap.add_argument("--smoke-cpu", action="store_true", help="rehearse on CPU with gloo (no figures)")
    ns = ap.parse_args()
    pairs, steps = (1, 10) if ns.smoke_cpu else ((2, 100) if ns.quick else (ns.pairs, ns.steps))
    import torch

    per_gpu = max(1, ns.ranks_per_gpu)
    backend = "nccl" if per_gpu == 1 else "gloo"
    n = 2 if ns.smoke_cpu else torch.cuda.device_count() * per_gpu
    if n == 0:
        print("no CUDA device: bench.gpu_steady needs a GPU (--smoke-cpu rehearses it on CPU)", file=sys.stderr)
        return 1
    adopt_orphans()
    os.environ["OMP_NUM_THREADS"] = "1"  # the same for both launchers
    tmp = tempfile.mkdtemp(prefix="nblaunch-bench-gpu-steady-")
    script = os.path.join(tmp, "train.py")
    with open(script, "w") as fh:
        fh.write(TORCHRUN_SCRIPT)
    log = os.path.join(tmp, "runs.log")
    launchers = {
        "nblaunch fork": lambda res, k: run_nblaunch(n, k, res, ns.smoke_cpu, log, backend, ns.warmup),
        "torchrun": lambda res, k: run_torchrun(n, k, res, ns.smoke_cpu, log, script, backend, ns.warmup),
    }
    rates: dict[str, list[float]] = {name: [] for name in launchers}
    how: dict[str, set] = {name: set() for name in launchers}
    ratios, params = [], None
    t_start = time.monotonic()
    warm_steps = max(5, steps // 10)
    # a measured pair against the short warm-up pair: start-up is the same, the steps are more (at most 3x)
    longer = min(3.0, max(1.0, (steps + ns.warmup) / (warm_steps + ns.warmup)))
    for p in range(pairs + 1):  # pair 0 warms the caches (imports, page cache) with a short run
        t_pair = time.monotonic()
        order = list(launchers) if p % 2 == 0 else list(launchers)[::-1]
        got = {}
        for name in order:
            result = os.path.join(tmp, f"p{p}-{name.replace(' ', '_')}.json")
            how[name].add(launchers[name](result, steps if p else warm_steps))
            with open(result) as fh:
                figures = json.load(fh)
            got[name], params = figures["steps_per_s"], figures["params"]
            left = descendants()
            if left:
                stop_tree()
                raise RuntimeError(f"{name} left processes behind: {left}")
        note(f"pair {p}: " + ", ".join(f"{k} {v:.1f} steps/s" for k, v in got.items()))
        if p > 0:
            for name, v in got.items():
                rates[name].append(v)
            ratios.append(got["nblaunch fork"] / got["torchrun"])
        spent = time.monotonic() - t_start
        if p < pairs and spent + (time.monotonic() - t_pair) * (1.0 if p else longer) > ns.budget_s:
            note(f"stopping after {p} measured pair(s): the next would pass the {ns.budget_s:.0f}s budget")
            break
    if not ratios:
        print("no measured pair fitted in the budget", file=sys.stderr)
        return 1
    lo, hi = bootstrap_median_interval(ratios, level=0.95)
    cfg = MODEL_SMOKE if ns.smoke_cpu else MODEL
    where = "NCCL" if per_gpu == 1 else f"{per_gpu} ranks per card, gloo"
    accel = f"{gpus_described()}, {where}" if not ns.smoke_cpu else "CPU/gloo (smoke run: NOT a GPU figure)"
    lines = [
        heading(
            "Steady-state DDP training of a small transformer",
            "gpu_steady",
            ns.quick,
            f"{len(ratios)} paired run(s) after a warm-up pair, {steps} timed steps after {ns.warmup} warm-up steps",
            accel=accel,
            flags=_flags(ns, per_gpu),
        ),
        "",
        f"GPT-2 from a config ({cfg['n_layer']} layers, width {cfg['n_embd']}, {cfg['n_head']} heads, "
        f"{cfg['n_positions']} tokens, vocabulary {cfg['vocab_size']}; {params / 1e6:.1f}M parameters), "
        f"{n} rank(s), DDP, AdamW, {'bf16 autocast' if not ns.smoke_cpu else 'fp32'}, batch {BATCH} per rank.",
        "",
        "| launcher | ranks (start method/backend) | steps/s, median | min-max | runs |",
        "|---|---|---|---|---|",
    ]
    for name, xs in rates.items():
        lines.append(
            f"| {name} | {n} ({', '.join(sorted(how[name]))}) | {median(xs):.1f} | {min(xs):.1f}-{max(xs):.1f} | "
            f"{len(xs)} |"
        )
    lines += [
        "",
        f"nblaunch / torchrun, per pair: {', '.join(f'{r:.3f}' for r in ratios)}; median {median(ratios):.3f}x, "
        f"95 % bootstrap interval {lo:.3f}-{hi:.3f}.",
    ]
    name = "gpu_steady-smoke-cpu" if ns.smoke_cpu else ("gpu_steady" if per_gpu == 1 else "gpu_steady-shared")
    write_result(name, ns.quick, "\n".join(lines) + "\n")
    return 0


def _flags(ns, per_gpu: int) -> str:
    """The command line's flags past --quick, for the result's heading."""
    flags = " --smoke-cpu" if ns.smoke_cpu else ""
    if not ns.quick and not ns.smoke_cpu and (ns.pairs, ns.steps) != (4, 300):
        flags += f" --pairs {ns.pairs} --steps {ns.steps}"
    if ns.warmup != WARMUP:
        flags += f" --warmup {ns.warmup}"
    return flags + (f" --ranks-per-gpu {per_gpu}" if per_gpu > 1 else "")


if __name__ == "__main__":
    sys.exit(main())
