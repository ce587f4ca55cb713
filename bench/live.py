"""Live ranks against one-shot launches, through a real Jupyter kernel, in one run.

    python -m bench.live            # 50 live cells per figure, 10 one-shot
    python -m bench.live --quick    # 20 live, 3 one-shot

Measured (medians; wall time from execute_request to the kernel's idle, as a notebook sees it):
- a plain kernel cell ``x = 1`` (the floor: the kernel's own round trip);
- ``%%distributed`` ``x = 1`` on 2 live ranks, and the same cell one-shot (``%%distributed -n 2``);
- the same for a cell doing one ``all_reduce``;
- an iterative session: a cell with a 2 s "model load", then 10 short training cells (20 DDP steps
  each), live (load once) against one-shot (every cell loads again, as state does not survive).

Writes bench/results/live.md. The machine is shared with other work: figures move with its load.
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench.harness import adopt_orphans, descendants, heading, note, run_cell, start_kernel, write_result

ALL_REDUCE = "import torch, torch.distributed as dist\nt = torch.ones(1)\ndist.all_reduce(t)"
LOAD = (
    "import time, torch\nfrom torch import nn\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
    "time.sleep(2)  # the model load\ntorch.manual_seed(0)\nmodel = DDP(nn.Linear(64, 1))\n"
    "opt = torch.optim.SGD(model.parameters(), lr=0.01)"
)
TRAIN = (
    "for _ in range(20):\n    x = torch.randn(32, 64)\n    loss = model(x).pow(2).mean()\n"
    "    opt.zero_grad()\n    loss.backward()\n    opt.step()"
)


def _timed(k, code: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        run_cell(k, code, timeout=120)
        out.append(time.perf_counter() - t0)
    return out


def _ms(xs) -> str:
    return f"{statistics.median(xs) * 1e3:.1f} ms"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    n_live, n_shot = (20, 3) if a.quick else (50, 10)
    adopt_orphans()
    k = start_kernel()
    rows = []
    try:
        run_cell(k, "%load_ext kernelside", 60)
        plain = _timed(k, "x = 1", n_live)
        note("one-shot cells")
        run_cell(k, "%%distributed -n 2\nx = 1", 120)  # warm-up
        shot_x = _timed(k, "%%distributed -n 2\nx = 1", n_shot)
        shot_ar = _timed(k, "%%distributed -n 2\n" + ALL_REDUCE, n_shot)
        note("live cells")
        t0 = time.perf_counter()
        run_cell(k, "%distributed_start -n 2", 120)
        start_s = time.perf_counter() - t0
        run_cell(k, "%%distributed\nx = 1", 60)  # warm-up
        live_x = _timed(k, "%%distributed\nx = 1", n_live)
        live_ar = _timed(k, "%%distributed\n" + ALL_REDUCE, n_live)
        note("iterative session, live")
        t0 = time.perf_counter()
        run_cell(k, "%%distributed\n" + LOAD, 120)
        for _ in range(10):
            run_cell(k, "%%distributed\n" + TRAIN, 120)
        live_total = time.perf_counter() - t0 + start_s
        run_cell(k, "%distributed_stop", 60)
        note("iterative session, one-shot")
        t0 = time.perf_counter()
        run_cell(k, "%%distributed -n 2\n" + LOAD, 120)
        for _ in range(10):
            run_cell(k, "%%distributed -n 2\n" + LOAD + "\n" + TRAIN, 120)
        shot_total = time.perf_counter() - t0
    finally:
        k.shutdown()
    left = descendants()
    rows = [
        "| cell | live ranks | one-shot | live / one-shot |",
        "|---|---|---|---|",
        f"| plain kernel `x = 1` (no ranks) | {_ms(plain)} | | |",
        f"| `x = 1` on 2 ranks | {_ms(live_x)} | {_ms(shot_x)} | "
        f"{statistics.median(live_x) / statistics.median(shot_x):.3f} |",
        f"| one `all_reduce` on 2 ranks | {_ms(live_ar)} | {_ms(shot_ar)} | "
        f"{statistics.median(live_ar) / statistics.median(shot_ar):.3f} |",
        f"| iterative session: 2 s load + 10 training cells (live includes `%distributed_start`, "
        f"{start_s:.2f} s) | {live_total:.1f} s | {shot_total:.1f} s | {live_total / shot_total:.3f} |",
    ]
    text = (
        heading("Live ranks vs one-shot", "live", a.quick, f"{n_live} live / {n_shot} one-shot cells per figure")
        + "\nThe machine is shared with other agents' work: every figure moves with its load.\n\n"
        + "\n".join(rows)
        + f"\n\nprocesses left behind: {len(left)}\n"
    )
    write_result("live", a.quick, text)
    return 0 if not left else 1


if __name__ == "__main__":
    raise SystemExit(main())
