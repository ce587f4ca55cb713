"""DeepSpeed ZeRO-2 through Accelerate on the GPU: the training code of tests/test_deepspeed.py, on CUDA in bf16,
run by the real ``accelerate launch`` and by ``notebook_launcher`` on the same Accelerate config file (DeepSpeed
with a JSON config), must run DeepSpeed's engine with its ZeRO-2 optimizer on the GPU and give the same losses.

One rank per GPU (NCCL); DeepSpeed's optimizer is torch's AdamW (``torch_adam``), so nothing is compiled on the
machine. The test process (the kernel's stand-in) never initializes CUDA: ``accelerate launch`` runs as a child.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
from gpu_scenario import REPO

from kernelside import last_report, notebook_launcher

pytestmark = pytest.mark.usefixtures("gpu_left_clean")

TRAIN = """
import torch, torch.distributed as dist
from accelerate import Accelerator
from accelerate.utils import DummyOptim
accelerator = Accelerator()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
model, optimizer = accelerator.prepare(model, DummyOptim(model.parameters()))
rank, world = dist.get_rank(), dist.get_world_size()
g = torch.Generator().manual_seed(1)
x = torch.randn(128, 8, generator=g).to(accelerator.device)
y = x.sum(1, keepdim=True)
losses = []
for step in range(8):
    lo = (step * world + rank) * 8
    out = model(x[lo:lo + 8].to(torch.bfloat16))
    loss = torch.nn.functional.mse_loss(out.float(), y[lo:lo + 8])
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    mean = loss.detach().clone()
    dist.all_reduce(mean)
    losses.append(mean.item() / world)
result = dict(engine=type(model).__name__, optimizer=type(optimizer.optimizer).__name__, losses=losses, world=world,
              device=str(next(model.parameters()).device), backend=dist.get_backend())
"""
SCRIPT = TRAIN + "\nif rank == 0:\n    print('RESULT ' + __import__('json').dumps(result), flush=True)\n"
ZERO2 = {
    "train_micro_batch_size_per_gpu": 8,
    "gradient_accumulation_steps": 1,
    "zero_optimization": {"stage": 2},
    "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "torch_adam": True}},
    "bf16": {"enabled": True},
}


def train_from_config():
    namespace = {}
    exec(TRAIN, namespace)
    return namespace["result"]


def test_deepspeed_zero2_from_an_accelerate_config_runs_on_the_gpu_with_the_loss_of_accelerate_launch(
    gpus, tmp_path, monkeypatch
):
    import yaml

    assert importlib.util.find_spec("deepspeed") is not None, (
        "DeepSpeed is not installed in this python: on a machine without network, carry its wheel (make gpu-wheels)"
    )
    from bench.harness import free_port

    (tmp_path / "train.py").write_text(SCRIPT)
    (tmp_path / "zero2.json").write_text(json.dumps(ZERO2))
    config = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "DEEPSPEED",
        "mixed_precision": "bf16",
        "deepspeed_config": {"deepspeed_config_file": "zero2.json", "zero3_init_flag": False},
        "num_machines": 1,
        "num_processes": gpus,
        "machine_rank": 0,
        "main_process_ip": "127.0.0.1",
        "main_process_port": free_port(),
    }
    (tmp_path / "zero2.yaml").write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELERATE_")}
    env.update(HF_HOME=str(tmp_path / "hf"), OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", "zero2.yaml", "train.py"]
    run = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, f"accelerate launch:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    expected = json.loads(next(ln for ln in run.stdout.splitlines() if ln.startswith("RESULT "))[7:])

    monkeypatch.chdir(tmp_path)  # the JSON config's relative path, as accelerate launch resolves it
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("NBLAUNCH_CONFIG", raising=False)
    for k in [k for k in os.environ if k.startswith("ACCELERATE_")]:
        monkeypatch.delenv(k)
    got = notebook_launcher(train_from_config, num_processes=gpus, config="zero2.yaml")
    for side in (expected, got):
        assert (side["engine"], side["optimizer"]) == ("DeepSpeedEngine", "DeepSpeedZeroOptimizer"), side
        assert (side["device"], side["backend"], side["world"]) == ("cuda:0", "nccl", gpus), side
    assert got["losses"] == pytest.approx(expected["losses"], rel=1e-3)
    assert last_report().backend == "nccl"
