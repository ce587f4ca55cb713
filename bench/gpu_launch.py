"""Launch cost on a GPU, N = 1 with NCCL: nblaunch fork against torchrun and Accelerate's notebook_launcher.

    python -m bench.gpu_launch              # 5 measured runs per launcher after a warm-up (sized for ~1 min)
    python -m bench.gpu_launch --quick      # 2 runs
    python -m bench.gpu_launch --smoke-cpu  # the same code on CPU with gloo, 1 run: a rehearsal, never a figure

Every launcher does the same work on the GPU: the NCCL process group up and a barrier on the device
(which makes NCCL build its communicator; nblaunch does this before user code runs), then one
all_reduce of a CUDA tensor, and return. Measured as in bench/launch.py: *start-up*, the call until
rank 0 runs user code with the process group up; *end to end*, the whole call. nblaunch and torchrun
alternate run by run (the order flips each round), so drift of the machine hits both alike.

Accelerate's notebook_launcher with num_processes=1 starts no process: it calls the function in the
calling process, which sets up its own process group and from then on holds a CUDA context (every
later nblaunch launch from that process would have to spawn). Its runs therefore come last, after a
warm-up call that pays CUDA's initialization, and its figures are those of a call in the notebook
itself.

The script stops starting rounds once ``--budget-s`` would be exceeded and says how many it ran.
Writes bench/results/gpu_launch.md (gpu_launch-smoke-cpu.md for --smoke-cpu) and prints it.
"""

from __future__ import annotations

import argparse
import contextlib
import io
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
    gpus_described,
    heading,
    mark_ready,
    median,
    note,
    ready_times,
    stop_tree,
    torchrun_cmd,
    write_result,
)


def work_under_nblaunch(outdir: str, device: str) -> float:
    """nblaunch has set up the process group (and met once on the device) before this runs."""
    import torch
    import torch.distributed as dist

    mark_ready(outdir, dist.get_rank())
    t = torch.ones(1, device=device)
    dist.all_reduce(t)
    return t.item()  # .item() waits for the GPU


def work_with_own_process_group(outdir: str, device: str, backend: str) -> float:
    """Under torchrun and Accelerate the function sets up what nblaunch sets up, then does the same work."""
    import os

    import torch
    import torch.distributed as dist

    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device == "cuda":
        torch.cuda.set_device(local)
    if not dist.is_initialized():
        dist.init_process_group(backend)
    if backend == "nccl":
        dist.barrier(device_ids=[local])
    else:
        dist.barrier()
    mark_ready(outdir, dist.get_rank())
    t = torch.ones(1, device=device)
    dist.all_reduce(t)
    value = t.item()
    dist.destroy_process_group()
    return value


TORCHRUN_SCRIPT = textwrap.dedent("""\
    import sys
    from bench.gpu_launch import work_with_own_process_group
    work_with_own_process_group(sys.argv[1], sys.argv[2], sys.argv[3])
    """)


def run_nblaunch(outdir: str, device: str, backend: str) -> None:
    from kernelside import last_report, notebook_launcher

    notebook_launcher(work_under_nblaunch, args=(outdir, device), num_processes=1, start_method="fork", output="none")
    rep = last_report()
    assert (rep.backend, rep.start_method) == (backend, "fork"), (rep.backend, rep.start_method)


def run_torchrun(outdir: str, device: str, backend: str, script: str) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)}
    subprocess.run(
        torchrun_cmd(1, script, outdir, device, backend),
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        timeout=120,
    )


def run_accelerate(outdir: str, device: str, backend: str) -> None:
    from accelerate import notebook_launcher

    # num_processes=1: Accelerate calls the function right here and sets no process-group variables
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    with contextlib.redirect_stdout(io.StringIO()):  # "Launching training on one GPU."
        notebook_launcher(work_with_own_process_group, args=(outdir, device, backend), num_processes=1)


def measure(fn) -> tuple[float, float]:
    """(start-up, end to end) of one launch, in seconds; checks that nothing outlived it."""
    outdir = tempfile.mkdtemp(prefix="nblaunch-bench-gpu-")
    t0 = time.time()
    fn(outdir)
    t1 = time.time()
    left = descendants()
    if left:
        stop_tree()
        raise RuntimeError(f"the launch left processes behind: {left}")
    return ready_times(outdir, 1)[0] - t0, t1 - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2 measured runs per launcher")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--budget-s", type=float, default=75.0, help="start no round that would end after this")
    ap.add_argument("--smoke-cpu", action="store_true", help="rehearse on CPU with gloo (no figures)")
    ns = ap.parse_args()
    runs = 1 if ns.smoke_cpu else (2 if ns.quick else ns.runs)
    device, backend = ("cpu", "gloo") if ns.smoke_cpu else ("cuda", "nccl")
    import torch

    from kernelside.launch import cuda_guard

    if not ns.smoke_cpu and torch.cuda.device_count() == 0:
        print("no CUDA device: bench.gpu_launch needs a GPU (--smoke-cpu rehearses it on CPU)", file=sys.stderr)
        return 1
    if cuda_guard.is_cuda_initialized():
        print(f"CUDA is already initialized in this process ({cuda_guard.first_init_site()})", file=sys.stderr)
        return 1
    adopt_orphans()
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # the same for every launcher
    script = os.path.join(tempfile.mkdtemp(prefix="nblaunch-bench-gpu-"), "work.py")
    with open(script, "w") as fh:
        fh.write(TORCHRUN_SCRIPT)
    pair = {
        "nblaunch fork": lambda d: run_nblaunch(d, device, backend),
        "torchrun": lambda d: run_torchrun(d, device, backend, script),
    }
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in (*pair, "accelerate notebook_launcher")}
    t_start, rounds = time.monotonic(), 0
    for i in range(runs + 1):  # round 0 is the warm-up
        t_round = time.monotonic()
        order = list(pair.items()) if i % 2 == 0 else list(pair.items())[::-1]
        for name, fn in order:
            s, e = measure(fn)
            if i > 0:
                samples[name].append((s, e))
            note(f"round {i} {name}: start-up {s:.3f}s, end to end {e:.3f}s")
        rounds = i
        spent = time.monotonic() - t_start
        if i < runs and spent + (time.monotonic() - t_round) > ns.budget_s * 0.8:
            note(f"stopping after {i} measured round(s): the next would pass the {ns.budget_s:.0f}s budget")
            break
    # Accelerate last: its N=1 call initializes CUDA in this process for good.
    for i in range(len(samples["nblaunch fork"]) + 1):
        s, e = measure(lambda d: run_accelerate(d, device, backend))
        if i > 0:
            samples["accelerate notebook_launcher"].append((s, e))
        note(f"accelerate {i}: start-up {s:.3f}s, end to end {e:.3f}s")
    accel = f"{gpus_described()}, NCCL" if not ns.smoke_cpu else "CPU/gloo (smoke run: NOT a GPU figure)"
    lines = [
        heading(
            "Launch cost on a GPU, N=1",
            "gpu_launch",
            ns.quick,
            f"median of {rounds} measured round(s) after a warm-up, nblaunch and torchrun alternating",
            accel=accel,
            flags=" --smoke-cpu" if ns.smoke_cpu else "",
        ),
        "",
        "| launcher | N | where the rank runs | start-up (s) | end to end (s) | end to end, min-max (s) "
        "| vs torchrun |",
        "|---|---|---|---|---|---|---|",
    ]
    ref = median(e for _, e in samples["torchrun"])
    where = {
        "nblaunch fork": "forked worker",
        "torchrun": "torchrun's worker process",
        "accelerate notebook_launcher": "the calling process (no worker at N=1)",
    }
    for name, got in samples.items():
        ends = [e for _, e in got]
        lines.append(
            f"| {name} | 1 | {where[name]} | {median(s for s, _ in got):.3f} | {median(ends):.3f} | "
            f"{min(ends):.3f}-{max(ends):.3f} | {median(ends) / ref:.2f}x |"
        )
    lines += [
        "",
        f"Work: the {backend} process group up, a barrier on the device, one all_reduce of a {device} tensor. "
        "Accelerate's figures are a call in the notebook itself after CUDA was initialized there by its warm-up "
        "call; nblaunch and torchrun start a fresh CUDA context in a new process every time.",
    ]
    write_result("gpu_launch-smoke-cpu" if ns.smoke_cpu else "gpu_launch", ns.quick, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
