"""The panel's "Export to Accelerate" writes a file that `accelerate launch --config_file` runs."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
from reference_scripts import LEAVE

from jupyter_ext.config_store import ConfigStore
from kernelside import config

PROBE = """
import os
from accelerate import Accelerator
accelerator = Accelerator()
with open(f"rank{os.environ['RANK']}.txt", "w") as out:
    out.write(f"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']} precision {accelerator.mixed_precision}")
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.processes  # two ranks under accelerate launch
def test_exported_config_launches_two_ranks_with_accelerate(tmp_path, monkeypatch):
    monkeypatch.delenv(config.ENV_CONFIG, raising=False)
    root = tmp_path / "root"
    root.mkdir()
    (root / "probe.py").write_text(PROBE + LEAVE)  # (reference_scripts.py)
    values = {"num_processes": 2, "mixed_precision": "bf16", "main_process_port": _free_port()}
    answer = ConfigStore(root).export_accelerate({"path": "accelerate_config.yaml", "values": values})
    assert answer["command"] == "accelerate launch --config_file accelerate_config.yaml train.py"

    accelerate = [sys.executable, "-m", "accelerate.commands.launch"]
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        [*accelerate, "--config_file", "accelerate_config.yaml", "probe.py"],
        cwd=root, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    lines = sorted(p.read_text() for p in root.glob("rank*.txt"))
    assert lines == ["rank 0 of 2 precision bf16", "rank 1 of 2 precision bf16"]
