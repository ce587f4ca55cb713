"""What capturing the frameworks' loggers costs a rank, per call, against ``log_metrics()``.

    python -m bench.metrics_capture            # 20,000 calls per logger, 7 interleaved rounds
    python -m bench.metrics_capture --quick    # 2,000 calls, 3 rounds

On rank 0 of one nblaunch launch (2 workers, fork), each logger is called N times through the method
the frameworks expose (captured: nblaunch's wrapper, then the framework's own method) and N times
through the framework's own method alone (``__wrapped__``, what runs without nblaunch). The capture's
cost per call is the difference; ``log_metrics(step=i, loss=x)`` is called N times in the same rounds.
Rounds interleave every row, so drift on this shared machine hits them alike; medians are shown.

Loggers: ``accelerator.log({"loss": x}, step=i)`` without trackers, ``SummaryWriter.add_scalar`` to a
real event file, ``Trainer.log`` of a tiny transformers model (report_to none), Lightning's logger
connector ``log_metrics`` with a tensor value and its default TensorBoard logger (what
``self.log`` ends in), ``fabric.log``.

Writes bench/results/metrics_capture.md and prints it. Target (issue 13): the capture costs the rank
no more per call than ``log_metrics()`` does.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

from bench.harness import adopt_orphans, descendants, heading, median, note, write_result

LOGGERS = (
    "accelerator.log",
    "SummaryWriter.add_scalar",
    "Trainer.log",
    "Lightning log_metrics (self.log)",
    "fabric.log",
)


def _callers(tmp: str) -> dict:
    """{logger: {"framework only", "captured", "capture alone": callable(step)}}."""
    import lightning as L
    import torch
    from accelerate import Accelerator
    from torch.utils.tensorboard import SummaryWriter
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from kernelside.worker import metric_capture

    acc = Accelerator()
    writer = SummaryWriter(os.path.join(tmp, "tb"))
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=16, n_positions=8))
    args = TrainingArguments(output_dir=tmp, report_to="none", use_cpu=True)  # no PrinterCallback prints
    trainer = Trainer(model=model, args=args)
    pl = L.Trainer(accelerator="cpu", devices=1, default_root_dir=tmp, enable_progress_bar=False)
    connector = pl._logger_connector
    fabric = L.Fabric(accelerator="cpu", devices=1)
    loss = torch.tensor(0.5)
    capture_state = metric_capture.CAPTURE

    def three(owner, name, call):
        method = getattr(owner, name)
        original = method.__wrapped__.__get__(owner)

        def framework_only(i):
            # as inside a captured call: what the framework logs through (TensorBoard) is not recorded
            capture_state.depth += 1
            try:
                call(original, i)
            finally:
                capture_state.depth -= 1

        # nblaunch's wrapper and capture around a method that does nothing: the capture's own work, without the
        # framework's (large, jittery) file writes in the measurement
        capture = next(c for m in metric_capture._PATCHES.values() for cls, meth, c in m if meth == name and c)
        noop = type("NoOp", (), {name: lambda self, *a, **k: None, "state": getattr(owner, "state", None)})
        metric_capture._wrap(noop, name, capture)
        stub = getattr(noop(), name)
        return {
            "framework only": framework_only,
            "captured": lambda i: call(method, i),
            "capture alone": lambda i: call(stub, i),
        }

    return {
        "accelerator.log": three(acc, "log", lambda f, i: f({"loss": 0.5}, step=i)),
        "SummaryWriter.add_scalar": three(writer, "add_scalar", lambda f, i: f("loss", 0.5, i)),
        "Trainer.log": three(trainer, "log", lambda f, i: f({"loss": 0.5, "learning_rate": 1e-3})),
        "Lightning log_metrics (self.log)": three(
            connector, "log_metrics", lambda f, i: f({"train_loss": loss}, step=i)
        ),
        "fabric.log": three(fabric, "log_dict", lambda f, i: f({"loss": 0.5}, step=i)),
    }


KINDS = ("framework only", "captured", "capture alone")


def rounds(n: int, count: int):
    """In the worker (rank 0): {row: [seconds per call, one per round]}."""
    import torch
    import torch.distributed as dist

    from kernelside import log_metrics
    from kernelside.worker import import_patches

    if dist.get_rank() != 0:
        return None
    callers = _callers(tempfile.mkdtemp())
    assert import_patches._FINDER in sys.meta_path, "the capture is not installed in this rank"
    loss = torch.tensor(0.5)
    times: dict[str, list[float]] = {"log_metrics": [], "log_metrics tensor": []}
    times.update({f"{name}: {kind}": [] for name in LOGGERS for kind in KINDS})
    for _ in range(count):
        t0 = time.perf_counter()
        for i in range(n):
            log_metrics(step=i, loss=0.5)
        times["log_metrics"].append((time.perf_counter() - t0) / n)
        t0 = time.perf_counter()
        for i in range(n):
            log_metrics(step=i, loss=loss)
        times["log_metrics tensor"].append((time.perf_counter() - t0) / n)
        for name in LOGGERS:
            for kind in KINDS:
                call = callers[name][kind]
                t0 = time.perf_counter()
                for i in range(n):
                    call(i)
                times[f"{name}: {kind}"].append((time.perf_counter() - t0) / n)
    return times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2,000 calls per logger, 3 rounds")
    ns = ap.parse_args()
    adopt_orphans()
    n, count = (2_000, 3) if ns.quick else (20_000, 7)

    from kernelside import last_report, notebook_launcher

    notebook_launcher(rounds, args=(50, 1), num_processes=2, start_method="fork", output="none")  # warm-up
    times = notebook_launcher(rounds, args=(n, count), num_processes=2, start_method="fork", output="none")
    points = len(last_report().metrics)
    expected = count * n * (2 + 2 * len(LOGGERS))  # log_metrics, captured and capture-alone calls each add one
    left = descendants()
    lm = median(times["log_metrics"])
    lm_tensor = median(times["log_metrics tensor"])
    note(f"log_metrics: {lm * 1e6:.2f} us per call, {lm_tensor * 1e6:.2f} with a tensor value")
    lines = [
        heading(
            "Capture of the frameworks' loggers, cost per call on the rank",
            "metrics_capture",
            ns.quick,
            f"{n:,} calls per row and round, median of {count} interleaved rounds",
        ),
        "",
        "On rank 0 of an nblaunch launch (2 workers, fork). *framework only*: the framework's own method, what runs "
        "without nblaunch (nothing it logs through, such as TensorBoard, is recorded). *captured*: the same call "
        "through nblaunch's wrapper. *difference*: median over the rounds of captured minus framework only (noisy "
        "where the framework writes files). *capture alone*: nblaunch's wrapper and capture around a method that "
        "does nothing, i.e. what the capture itself adds to each call; that is what the target compares, against "
        "log_metrics() with the same kind of value (a float; a 0-d tensor for Lightning, whose values are tensors).",
        "",
        "| logger | framework only (µs) | captured (µs) | difference (µs) | capture alone (µs) | vs log_metrics() |",
        "|---|---|---|---|---|---|",
        f"| log_metrics(step=i, loss=0.5) | - | - | - | {lm * 1e6:.2f} | 1.00x |",
        f"| log_metrics(step=i, loss=torch.tensor(0.5)) | - | - | - | {lm_tensor * 1e6:.2f} | 1.00x |",
    ]
    worst = 0.0
    for name in LOGGERS:
        plain, captured, alone = (median(times[f"{name}: {k}"]) for k in KINDS)
        diff = median(
            [c - p for c, p in zip(times[f"{name}: captured"], times[f"{name}: framework only"], strict=True)]
        )
        ref = lm_tensor if name.startswith("Lightning") else lm
        worst = max(worst, alone / ref)
        lines.append(
            f"| {name} | {plain * 1e6:.2f} | {captured * 1e6:.2f} | {diff * 1e6:.2f} | {alone * 1e6:.2f} | "
            f"{alone / ref:.2f}x |"
        )
        note(f"{name}: {plain * 1e6:.2f} -> {captured * 1e6:.2f} us per call, capture alone {alone * 1e6:.2f} us")
    met = "met" if worst <= 1.0 else "NOT met"
    lines += [
        "",
        f"Points that reached the run report: {points:,} of the {expected:,} recorded (the throttle sends them in "
        "batches; none is dropped).",
        "",
        f"Target: the capture costs the rank no more per call than log_metrics() — {met} (worst {worst:.2f}x).",
    ]
    if left:
        lines.append(f"\nProcesses left behind after the launches: {left}.")
    write_result("metrics_capture", ns.quick, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
