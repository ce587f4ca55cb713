"""Soak: a function that trains an ``accelerator.prepare``d model and ends with ``end_training()``,
launched again and again; how many launches hang at the rank's end.

    python -m bench.end_training_soak                       # 200 launches, notebook_launcher and %%distributed
    python -m bench.end_training_soak --launches 40 --modes launcher
    python -m bench.end_training_soak --quick               # 10 of each

``end_training()`` destroys the default process group while the DDP model is still alive; when the
function's locals are freed, DDP's reducer drops the last reference to the gloo process group and its
destructor joins gloo's threads while holding the GIL, which one of them waits for: the rank never
exits (torch 2.13). Each launch has its own timeout (``--timeout``, the launch's own ``timeout=``), so a
hang is counted and stopped, not waited on; the launch's error then says it timed out.

Modes: ``launcher`` (``notebook_launcher`` in this process), ``cell`` (a ``%%distributed`` cell in an
IPython shell in this process). Writes bench/results/end_training_soak[-quick].md and prints it.
"""

from __future__ import annotations

import argparse
import sys
import time

from bench.harness import adopt_orphans, descendants, heading, write_result

CELL = """%%distributed -n 2 --timeout {timeout}
import torch
from accelerate import Accelerator
from bench.end_training_soak import train_steps

accelerator = Accelerator(cpu=True)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
model, opt = accelerator.prepare(model, opt)
loss = train_steps(accelerator, model, opt)
accelerator.end_training()
"""


def train_steps(accelerator, model, opt, steps: int = 5) -> float:
    """A few DDP steps on made-up data (shared by both modes)."""
    import torch

    g = torch.Generator().manual_seed(accelerator.process_index)
    loss = None
    for _ in range(steps):
        x = torch.randn(8, 16, generator=g)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        accelerator.backward(loss)
        opt.step()
    return float(loss.detach())


def train_and_end():
    """What Accelerate's docs show: prepare, train, end_training() with the model still in scope."""
    import torch
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model, opt = accelerator.prepare(model, opt)
    loss = train_steps(accelerator, model, opt)
    accelerator.end_training()
    return loss


def _launcher(timeout: float) -> str:
    from kernelside import LaunchTimeoutError, notebook_launcher

    try:
        notebook_launcher(train_and_end, num_processes=2, timeout=timeout)
        return "ok"
    except LaunchTimeoutError:
        return "hang"
    except Exception as e:  # noqa: BLE001 - a failure is counted and named, the soak goes on
        return f"error: {type(e).__name__}: {str(e).splitlines()[0][:200]}"


def _cell_runner():
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_cell("%load_ext kernelside")

    def run(timeout: float) -> str:
        result = shell.run_cell(CELL.format(timeout=timeout), silent=True)
        err = result.error_in_exec
        if err is None:
            return "ok"
        if isinstance(err, TimeoutError):
            return "hang"
        return f"error: {type(err).__name__}: {str(err).splitlines()[0][:200]}"

    return run


def soak(mode: str, launches: int, timeout: float) -> dict:
    run = _cell_runner() if mode == "cell" else _launcher
    outcomes: dict[str, int] = {}
    times = []
    for i in range(launches):
        t0 = time.monotonic()
        outcome = run(timeout)
        times.append(time.monotonic() - t0)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        if outcome != "ok":
            print(f"  {mode} launch {i + 1}: {outcome}", file=sys.stderr, flush=True)
        left = descendants()
        assert not left, f"launch {i + 1} left processes behind: {left}"
    times.sort()
    return {"outcomes": outcomes, "median_s": times[len(times) // 2], "max_s": times[-1]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--launches", type=int, default=200)
    ap.add_argument("--modes", default="launcher,cell")
    ap.add_argument("--timeout", type=float, default=20.0, help="each launch's own timeout: past it, a hang")
    ap.add_argument("--quick", action="store_true", help="10 launches of each mode")
    ap.add_argument("--label", default="", help="a word for the result file and table (e.g. 'before')")
    args = ap.parse_args()
    launches = 10 if args.quick else args.launches
    adopt_orphans()
    rows = [
        "| mode | launches | hangs | other failures | median s | slowest s |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for mode in args.modes.split(","):
        r = soak(mode, launches, args.timeout)
        hangs = r["outcomes"].get("hang", 0)
        other = launches - hangs - r["outcomes"].get("ok", 0)
        name = "notebook_launcher" if mode == "launcher" else "%%distributed cell"
        rows.append(f"| {name} | {launches} | {hangs} | {other} | {r['median_s']:.2f} | {r['max_s']:.2f} |")
    label = f" ({args.label})" if args.label else ""
    what = f"end_training() soak{label}, 2 ranks, each launch's timeout {args.timeout:g} s"
    flags = f" --launches {launches} --modes {args.modes}" + (f" --label {args.label}" if args.label else "")
    head = heading(what, "end_training_soak", args.quick, f"{launches} launches per mode", flags=flags)
    name = "end_training_soak" + (f"-{args.label}" if args.label else "")
    write_result(name, args.quick, head + "\n\n" + "\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
