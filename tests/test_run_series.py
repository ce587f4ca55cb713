"""The run folder's ``series.jsonl``: what the Runs dashboard draws the training curves and each rank's pace
from. A real kernel runs a 3-rank cell in which rank 2 is slower; the server's reader (``RunCurves`` over
``RunDir``, as the route reads it) finds every rank's bar (rank 0's shown in the cell, the others' pace
only), each ending at its total, rank 2's steps per second lowest, and rank 0's metrics as the cell drew them."""

from __future__ import annotations

import json
import os

import nbformat
import pytest
from nbclient import NotebookClient

from jupyter_ext.run_curves import RunCurves
from jupyter_ext.run_files import RunDir
from kernelside.launch.run_series import RunSeries
from kernelside.run_contract import SERIES_FILE

pytestmark = pytest.mark.kernel  # starts kernels

STEPS = 30
CELL = f"""%%distributed -n 3
import time
from kernelside import log_metrics, progress
for i in progress(range({STEPS}), desc="train"):
    time.sleep(0.12 if rank == 2 else 0.04)
    log_metrics(step=i, loss=1.0 / (i + 1))
"""


def _pace(bar: dict) -> float:
    (t0, n0), (t1, n1) = bar["pace"][0], bar["pace"][-1]
    return (n1 - n0) / (t1 - t0)


def test_every_ranks_pace_and_rank0s_metrics_reach_the_run_folder_and_the_slow_rank_is_slowest(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(c)
        for c in ("%load_ext kernelside", CELL, "print(__import__('kernelside').last_report().log_dir)")
    ]
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    run_dir = nb.cells[2].outputs[0]["text"].strip()
    with RunDir.open(run_dir) as d:
        curves = RunCurves().read(d, os.path.basename(run_dir))
    bars = {bar["rank"]: bar for bar in curves["bars"] if bar["desc"] == "train"}
    assert sorted(bars) == [0, 1, 2], curves["bars"]
    assert all(bar["pace"][-1][1] == STEPS and bar["total"] == STEPS for bar in bars.values())
    assert _pace(bars[2]) < min(_pace(bars[0]), _pace(bars[1])), {r: _pace(b) for r, b in bars.items()}
    points = curves["metrics"]
    assert [p["step"] for p in points] == list(range(STEPS)), points[:3]
    assert {p["from_rank"] for p in points} == {0} and points[-1]["loss"] == 1.0 / STEPS
    assert os.stat(os.path.join(run_dir, SERIES_FILE)).st_mode & 0o777 == 0o600


def test_a_nan_loss_is_a_gap_a_tensor_like_its_number_and_the_file_stops_at_its_limit(tmp_path):
    class OneNumber:  # what a 0-d tensor offers: __float__
        def __float__(self):
            return 0.5

    series = RunSeries(str(tmp_path), max_bytes=400)
    series.event(0, "metrics", [{"step": 1, "loss": float("nan"), "acc": OneNumber(), "tags": object()}])
    for step in range(20):
        series.event(0, "metrics", [{"step": step, "loss": 1.0}])
    lines = [json.loads(line) for line in (tmp_path / SERIES_FILE).read_text().splitlines()]
    assert lines[0]["points"] == [{"step": 1, "loss": None, "acc": 0.5}]
    assert lines[-1] == {"kind": "full", "wall": lines[-1]["wall"], "max_bytes": 400}
    assert (tmp_path / SERIES_FILE).stat().st_size <= 400 + 80
    with RunDir.open(str(tmp_path)) as d:
        assert RunCurves().read(d, "run-x")["full"] is True
