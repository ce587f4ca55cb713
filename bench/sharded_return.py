"""Returning a sharded ~200 MB model: time, and peak memory of rank 0, rank 1 and the kernel.

    python -m bench.sharded_return            # 12 x Linear(2048, 2048) (201 MB), 3 runs per case
    python -m bench.sharded_return --quick    # 12 x Linear(512, 512) (12.6 MB), 1 run

Each case runs in a fresh "kernel" process (a driver started by this script, one at a time) that
launches 2 workers (fork, gloo) with ``notebook_launcher``. The workers build the model on the meta
device, shard it, materialize their shards, take one optimizer step, and return. Cases:

- *FSDP2 model*: ``fully_shard`` per layer and at the root; the function returns the model, which
  nblaunch gathers (``DTensor.full_tensor()`` parameter by parameter) and sends as the plain module.
- *FSDP2 state dict, by hand*: what users write without nblaunch: the function returns
  ``get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))``.
- *FSDP1 model*: ``FullyShardedDataParallel`` per layer; nblaunch gathers its full state dict unit by
  unit and sends the plain module.
- *plain model, rank 0*: the same model unsharded on every rank, rank 0's returned (no gather): what a
  return costs anyway.

Measured: the call's wall time; rank 0 from the end of the function to its exit (gather, pickling,
sending); peak RSS (VmHWM) of each rank, polled every 5 ms until it exits, and its RSS when the
function returned (before any gather); the kernel's peak RSS during the call above its RSS before.

Writes bench/results/sharded_return.md and prints it. Target (issue 13): no rank holds more than one
full copy at a time while gathering, and the kernel receives one copy.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time

from bench.harness import adopt_orphans, descendants, heading, median, note, stop_tree, write_result

MiB = 1 << 20
CASES = ("FSDP2 model", "FSDP2 state dict, by hand", "FSDP1 model", "plain model, rank 0")


def _status(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def train_and_return(case: str, width: int, layers: int):
    """In a worker: build, shard, one step, return what the case returns; log RSS at the end of the function."""
    import torch
    import torch.distributed as dist
    from torch import nn

    from kernelside import log_metrics

    torch.manual_seed(0)

    def build():
        return nn.Sequential(*(nn.Linear(width, width, bias=False) for _ in range(layers)))

    if case == "plain model, rank 0":
        model = build()
    elif case.startswith("FSDP2"):
        from torch.distributed.fsdp import fully_shard

        with torch.device("meta"):
            model = build()
        for layer in model:
            fully_shard(layer)
        fully_shard(model)
        model.to_empty(device="cpu")
        for p in model.parameters():
            nn.init.normal_(p, std=0.02)
    else:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        with torch.device("meta"):
            model = build()
        model = FSDP(
            model,
            device_id=torch.device("cpu"),
            auto_wrap_policy=ModuleWrapPolicy({nn.Linear}),
            param_init_fn=lambda m: m.to_empty(device="cpu", recurse=False),
        )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model(torch.randn(4, width)).sum().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    del opt
    value = model
    if case == "FSDP2 state dict, by hand":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        value = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.get_rank() == 0:
        log_metrics(step=0, rss_at_return=_status(os.getpid(), "VmRSS"), hwm_at_return=_status(os.getpid(), "VmHWM"))
    return value


def driver(case: str, width: int, layers: int) -> dict:
    """The "kernel": one launch, polled; returns the measurements."""
    import torch

    from kernelside import last_report, notebook_launcher

    notebook_launcher(int, num_processes=2, output="none")  # warm-up: torch._dynamo and friends, once
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # reset this process's peak RSS
    before = _status(os.getpid(), "VmRSS")
    peaks: dict[int, int] = {}
    stop = threading.Event()

    def poll():
        while not stop.is_set():
            rep = last_report()
            for r in rep.ranks if rep is not None else ():
                try:
                    hwm = _status(r.pid, "VmHWM")  # 0 once it is a zombie
                except OSError:
                    hwm = 0  # gone
                peaks[r.rank] = max(peaks.get(r.rank, 0), hwm)  # its last reading before exiting stands
            time.sleep(0.005)

    t = threading.Thread(target=poll, daemon=True)
    t.start()
    t0 = time.monotonic()
    value = notebook_launcher(train_and_return, args=(case, width, layers), num_processes=2, output="none")
    wall = time.monotonic() - t0
    stop.set()
    t.join()
    rep = last_report()
    kernel_peak = _status(os.getpid(), "VmHWM")
    tensors = value.values() if isinstance(value, dict) else value.parameters()
    numel = sum(t.numel() for t in tensors)
    assert numel == width * width * layers, (numel, case)
    assert all(type(t) in (torch.Tensor, torch.nn.Parameter) for t in tensors)
    at_return = rep.metrics[-1]
    return {
        "wall": wall,
        "after_return": rep.ranks[0].ended_s - rep.ranks[0].done_s,
        "rank0_at_return": at_return["rss_at_return"],
        "rank0_peak": peaks.get(0, 0),
        "rank1_peak": peaks.get(1, 0),
        "kernel_extra": kernel_peak - before,
        "model_bytes": numel * 4,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="12 x Linear(512, 512), 1 run per case")
    ap.add_argument("--driver", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--width", type=int, default=2048, help=argparse.SUPPRESS)
    ns = ap.parse_args()
    layers = 12
    if ns.driver:
        print(json.dumps(driver(ns.driver, ns.width, layers)))
        return 0
    adopt_orphans()
    width, runs = (512, 1) if ns.quick else (2048, 3)
    results: dict[str, list[dict]] = {c: [] for c in CASES}
    for _ in range(runs):
        for case in CASES:  # interleaved, so drift on this shared machine hits every case alike
            cmd = [sys.executable, "-m", "bench.sharded_return", "--driver", case, "--width", str(width)]
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=os.getcwd())
            if p.returncode != 0:
                note(p.stderr[-3000:])
                raise SystemExit(f"{case}: driver failed")
            results[case].append(json.loads(p.stdout.strip().splitlines()[-1]))
            note(f"{case}: {results[case][-1]}")
    left = descendants()
    if left:
        stop_tree()
    model_mb = results[CASES[0]][0]["model_bytes"] / MiB
    lines = [
        heading(
            f"Returning a sharded {model_mb:.0f} MiB model from 2 workers",
            "sharded_return",
            ns.quick,
            f"median of {runs} runs per case, each in a fresh kernel process, interleaved",
        ),
        "",
        f"12 x Linear({width}, {width}) without bias ({model_mb:.1f} MiB of float32), sharded over 2 ranks (fork, "
        "gloo). RSS at return: rank 0 when the function returned, before any gather. Peaks are VmHWM.",
        "",
        "| case | call (s) | rank 0: return to exit (s) | rank 0 RSS at return (MiB) | rank 0 peak (MiB) | "
        "rank 0 peak − at return (MiB) | rank 1 peak (MiB) | kernel peak − before (MiB) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for case in CASES:
        rs = results[case]

        def m(key, rs=rs):
            return median([r[key] for r in rs])

        lines.append(
            f"| {case} | {m('wall'):.2f} | {m('after_return'):.2f} | {m('rank0_at_return') / MiB:.0f} | "
            f"{m('rank0_peak') / MiB:.0f} | {(m('rank0_peak') - m('rank0_at_return')) / MiB:.0f} | "
            f"{m('rank1_peak') / MiB:.0f} | {m('kernel_extra') / MiB:.0f} |"
        )
    if left:
        lines.append(f"\nProcesses left behind after the launches (stopped): {left}.")
    write_result("sharded_return", ns.quick, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
