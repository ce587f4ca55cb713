"""Live ranks against one-shot launches, through a real Jupyter kernel, in one run.

    python -m bench.live            # 50 live cells per figure, 10 one-shot
    python -m bench.live --quick    # 20 live, 3 one-shot

Measured (medians; wall time from execute_request to the kernel's idle, as a notebook sees it):
- a plain kernel cell ``x = 1`` (the floor: the kernel's own round trip);
- ``%%distributed`` ``x = 1`` on 2 live ranks, and the same cell one-shot (``%%distributed -n 2``);
- the same for a cell doing one ``all_reduce``;
- an iterative session: a cell with a 2 s "model load", then 10 short training cells (20 DDP steps
  each), live (load once) against one-shot ``%%distributed`` and Accelerate's ``notebook_launcher`` (every
  cell launches and loads again, as state does not survive);
- steady-state training (bench/steady.py's ``train``: DDP, 1 thread per rank) in a live cell against torchrun
  running the same function: paired runs, the order alternating, the ratio's 95 % bootstrap interval;
- the live-rank scenarios of bench/live_others.py (round trip, ■, a rank raising while its peer waits in
  ``barrier()``) for nblaunch, jupyter-distributed 0.1.1 and ipyparallel 9.2, in the same run.

Writes bench/results/live.md. The machine is shared with other work: figures move with its load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import textwrap
import time

from bench import live_others
from bench.harness import (
    adopt_orphans,
    bootstrap_median_interval,
    descendants,
    free_port,
    heading,
    note,
    run_cell,
    start_kernel,
    stop_tree,
    write_result,
)
from bench.steady import TORCHRUN_SCRIPT, run_torchrun

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

# Accelerate's notebook_launcher doing the same work: each cell is one launch, which loads again
ACC_DEF = (
    "from accelerate import notebook_launcher as acc_launch\n"
    "def acc_work(train):\n    import torch.distributed as dist\n"
    "    if not dist.is_initialized():  # Accelerate leaves this to the user\n"
    "        dist.init_process_group('gloo')\n"
    + textwrap.indent(LOAD, "    ")
    + "\n    if train:\n"
    + textwrap.indent(TRAIN, "        ")
    + "\n    dist.destroy_process_group()"
)
STEADY_STEPS = 300  # about 1 s timed per run on this machine, as in bench/steady.py at N = 2


def _acc_cell(train: bool) -> str:
    return f"acc_launch(acc_work, args=({train},), num_processes=2, use_port='{free_port()}')"


def _steady_pairs(k, pairs: int, tmp: str) -> list[tuple[dict, dict]]:
    """(live, torchrun) results of bench.steady.train, alternating which runs first."""
    script = os.path.join(tmp, "train.py")
    with open(script, "w") as fh:
        fh.write(TORCHRUN_SCRIPT)
    os.environ["OMP_NUM_THREADS"] = "1"  # torchrun's own default; the live ranks call set_num_threads(1)
    out = []
    for i in range(pairs):
        got = {}
        for who in ("live", "torchrun") if i % 2 == 0 else ("torchrun", "live"):
            path = os.path.join(tmp, f"{who}-{i}.json")
            if who == "live":
                run_cell(
                    k, f"%%distributed\nfrom bench.steady import train\ntrain({STEADY_STEPS}, False, 1, {path!r})", 120
                )
            else:
                run_torchrun(script, 2, (STEADY_STEPS, False, 1, path), os.path.join(tmp, "torchrun.log"))
            with open(path) as fh:
                got[who] = json.load(fh)
        note(
            f"steady pair {i + 1}/{pairs}: live {got['live']['median_steps_per_s']:.1f}, "
            f"torchrun {got['torchrun']['median_steps_per_s']:.1f} steps/s (typical step)"
        )
        out.append((got["live"], got["torchrun"]))
    return out


def _ratio_row(label: str, pairs, key: str) -> str:
    ratios = [a[key] / b[key] for a, b in pairs]
    lo, hi = bootstrap_median_interval(ratios, level=0.95)
    live = statistics.median(a[key] for a, _ in pairs)
    ref = statistics.median(b[key] for _, b in pairs)
    return f"| {label} | {live:.1f} | {ref:.1f} | {statistics.median(ratios):.3f} | {lo:.3f}-{hi:.3f} |"


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
    n_pairs = 3 if a.quick else 12
    adopt_orphans()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # every tool's gloo on the loopback, as nblaunch's own
    tmp = tempfile.mkdtemp(prefix="nblaunch-bench-live-")
    load0 = os.getloadavg()
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
        note("steady state, live cell against torchrun")
        steady = _steady_pairs(k, n_pairs, tmp)
        run_cell(k, "%distributed_stop", 60)
        note("iterative session, one-shot")
        t0 = time.perf_counter()
        run_cell(k, "%%distributed -n 2\n" + LOAD, 120)
        for _ in range(10):
            run_cell(k, "%%distributed -n 2\n" + LOAD + "\n" + TRAIN, 120)
        shot_total = time.perf_counter() - t0
    finally:
        k.shutdown()
    # Accelerate in a kernel of its own, as its users have: in the kernel above, after nblaunch's launches, the
    # first notebook_launcher call once did not return within 120 s (2026-12-01; not reproduced since)
    k = start_kernel()
    try:
        note("iterative session, Accelerate's notebook_launcher")
        run_cell(k, ACC_DEF, 60)
        t0 = time.perf_counter()
        run_cell(k, _acc_cell(False), 120)
        for _ in range(10):
            run_cell(k, _acc_cell(True), 120)
        acc_total = time.perf_counter() - t0
    finally:
        k.shutdown()
    left = descendants()
    stop_tree()  # so that nothing of ours is counted as a tool's below
    tools = [live_others.scenarios(tool, n_live) for tool in live_others.TOOLS]
    left += descendants()
    load1 = os.getloadavg()
    rows = [
        "| cell | live ranks | one-shot | live / one-shot |",
        "|---|---|---|---|",
        f"| plain kernel `x = 1` (no ranks) | {_ms(plain)} | | |",
        f"| `x = 1` on 2 ranks | {_ms(live_x)} | {_ms(shot_x)} | "
        f"{statistics.median(live_x) / statistics.median(shot_x):.3f} |",
        f"| one `all_reduce` on 2 ranks | {_ms(live_ar)} | {_ms(shot_ar)} | "
        f"{statistics.median(live_ar) / statistics.median(shot_ar):.3f} |",
        "",
        "| iterative session: 2 s load + 10 training cells | total | live / this |",
        "|---|---|---|",
        f"| nblaunch live ranks (with `%distributed_start`, {start_s:.2f} s) | {live_total:.1f} s | 1.000 |",
        f"| one-shot `%%distributed -n 2` (each cell loads again) | {shot_total:.1f} s | "
        f"{live_total / shot_total:.3f} |",
        f"| Accelerate `notebook_launcher` (each cell a launch that loads again) | {acc_total:.1f} s | "
        f"{live_total / acc_total:.3f} |",
        "",
        f"Steady state: bench/steady.py's DDP loop ({STEADY_STEPS} timed steps after 30 warm-up, 1 thread per rank, "
        f"N = 2) in a live `%%distributed` cell against torchrun running the same function; {len(steady)} pairs, "
        "interleaved, the order alternating; the ratio is the median of the per-pair ratios with its 95 % "
        "bootstrap interval. Target: live >= 0.98x torchrun.",
        "",
        "| steps/s | live cell | torchrun | live / torchrun | 95 % interval |",
        "|---|---|---|---|---|",
        _ratio_row("typical step (1 / median step)", steady, "median_steps_per_s"),
        _ratio_row("wall (timed steps / timed span)", steady, "steps_per_s"),
        "",
        f"Live-rank tools side by side (bench/live_others.py; 2 ranks, gloo on 127.0.0.1; `x = 1` median of {n_live} "
        f"cells; bounded waits of {live_others.BOUND_S} s; the interrupt is sent 1.5 s into the cell):",
        "",
        *live_others.table(tools),
    ]
    text = (
        heading("Live ranks vs one-shot", "live", a.quick, f"{n_live} live / {n_shot} one-shot cells per figure")
        + "\nThe machine is shared with other agents' work: every figure moves with its load "
        + f"(load average {load0[0]:.1f} at the start, {load1[0]:.1f} at the end; 1/5/15 min at the end: "
        + "/".join(f"{x:.1f}" for x in load1)
        + ").\n\n"
        + "\n".join(rows)
        + f"\n\nprocesses left behind: {len(left)}\n"
    )
    write_result("live", a.quick, text)
    return 0 if not left else 1


if __name__ == "__main__":
    raise SystemExit(main())
