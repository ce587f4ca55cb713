"""DeepSpeed runs, or the launch says why not: ZeRO-2 and ZeRO-3 on CPU ranks give the loss `accelerate launch` gives.

The same training code runs three ways on the same Accelerate config file (DeepSpeed with a DeepSpeed JSON config):
the real `accelerate launch` (on 127.0.0.1, in this test), nblaunch's `notebook_launcher`, and a `%%distributed`
cell in a real kernel; and once more with `Accelerator(deepspeed_plugin=...)` written in the cell and no DeepSpeed in
any config. Every way must run `DeepSpeedEngine` with DeepSpeed's ZeRO optimizer (not DDP with AdamW) and give the
same losses step by step. Where DeepSpeed cannot run (not installed; fp16 on a CPU without fp16 kernels), the launch
fails before any rank starts, saying what and why.

The first DeepSpeed run on a machine compiles DeepSpeed's shared-memory op for CPU (about a minute, cached in
~/.cache/torch_extensions), under `accelerate launch` as under nblaunch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml
from reference_scripts import LEAVE

from kernelside import notebook_launcher
from kernelside.errors import LaunchConfigError
from kernelside.launch import hardware

TRAIN = """
import torch, torch.distributed as dist
from accelerate import Accelerator
from accelerate.utils import DeepSpeedPlugin, DummyOptim
accelerator = {make_accelerator}
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
model, optimizer = accelerator.prepare(model, DummyOptim(model.parameters()))
rank, world = dist.get_rank(), dist.get_world_size()
g = torch.Generator().manual_seed(1)
x = torch.randn(128, 8, generator=g)
y = x.sum(1, keepdim=True)
losses = []
for step in range(8):
    lo = (step * world + rank) * 8
    dtype = next(model.parameters()).dtype  # (fp16 DeepSpeed holds half weights: its inputs must be half too)
    loss = torch.nn.functional.mse_loss(model(x[lo:lo + 8].to(dtype)).float(), y[lo:lo + 8])
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    mean = loss.detach().clone()
    dist.all_reduce(mean)
    losses.append(mean.item() / world)
result = dict(engine=type(model).__name__, optimizer=type(optimizer.optimizer).__name__, losses=losses, world=world)
"""
FROM_CONFIG = TRAIN.format(make_accelerator="Accelerator()")
FROM_PLUGIN = TRAIN.format(make_accelerator='Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config="zero2.json"))')
SCRIPT = FROM_CONFIG + "\nif rank == 0:\n    print('RESULT ' + __import__('json').dumps(result), flush=True)\n"
OPTIMIZER = {"type": "AdamW", "params": {"lr": 0.01, "torch_adam": True}}


def ds_json(stage: int) -> dict:
    return {
        "train_micro_batch_size_per_gpu": 8,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": stage},
        "optimizer": OPTIMIZER,
    }


def accelerate_config(stage: int, port: int) -> dict:
    return {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "DEEPSPEED",
        "deepspeed_config": {"deepspeed_config_file": f"zero{stage}.json", "zero3_init_flag": stage == 3},
        "num_machines": 1,
        "num_processes": 2,
        "machine_rank": 0,
        "main_process_ip": "127.0.0.1",
        "main_process_port": port,
    }


def train_from_config():
    namespace = {}
    exec(FROM_CONFIG, namespace)
    return namespace["result"]


@pytest.fixture(scope="module")
def workdir(starts_processes, tmp_path_factory):
    """The config files, and what the real `accelerate launch` trained with them (both stages at once)."""
    root = tmp_path_factory.mktemp("deepspeed")
    (root / "train.py").write_text(SCRIPT + LEAVE)  # (its exit is not compared: reference_scripts.py)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELERATE_")}
    env.update(HF_HOME=str(root / "hf"), OMP_NUM_THREADS="1")
    runs = {}
    for stage, port in ((2, 29741), (3, 29742)):
        (root / f"zero{stage}.json").write_text(json.dumps(ds_json(stage)))
        (root / f"zero{stage}.yaml").write_text(yaml.safe_dump(accelerate_config(stage, port)))
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", f"zero{stage}.yaml", "train.py"]
        runs[stage] = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    expected = {}
    for stage, proc in runs.items():
        out = proc.communicate(timeout=420)[0].decode(errors="replace")
        assert proc.returncode == 0, f"accelerate launch, ZeRO-{stage}:\n{out[-3000:]}"
        expected[stage] = json.loads(next(ln for ln in out.splitlines() if ln.startswith("RESULT "))[7:])
        assert expected[stage]["engine"] == "DeepSpeedEngine" and expected[stage]["world"] == 2
    return root, expected


@pytest.fixture
def in_workdir(workdir, monkeypatch):
    root, _ = workdir
    monkeypatch.chdir(root)  # the JSON config's relative path, as accelerate launch resolves it
    monkeypatch.setenv("HF_HOME", str(root / "hf"))
    monkeypatch.delenv("NBLAUNCH_CONFIG", raising=False)
    for k in [k for k in os.environ if k.startswith("ACCELERATE_")]:
        monkeypatch.delenv(k)
    return root


@pytest.fixture(scope="module")
def kernel(kernel_with, workdir):
    root, _ = workdir
    return kernel_with(cwd=root, env={"HF_HOME": str(root / "hf")})


ZERO_OPTIMIZER = {2: "DeepSpeedZeroOptimizer", 3: "DeepSpeedZeroOptimizer_Stage3"}


@pytest.mark.parametrize("stage", [2, 3])
def test_notebook_launcher_runs_deepspeed_zero_with_the_loss_of_accelerate_launch(stage, workdir, in_workdir):
    _, expected = workdir
    got = notebook_launcher(train_from_config, num_processes=2, config=f"zero{stage}.yaml")
    assert (got["engine"], got["optimizer"], got["world"]) == ("DeepSpeedEngine", ZERO_OPTIMIZER[stage], 2)
    assert expected[stage]["optimizer"] == ZERO_OPTIMIZER[stage]
    assert got["losses"] == pytest.approx(expected[stage]["losses"], rel=1e-5)


@pytest.mark.parametrize("stage", [2, 3])
def test_distributed_cell_runs_deepspeed_zero_with_the_loss_of_accelerate_launch(stage, workdir, kernel):
    _, expected = workdir
    kernel.run(f"%%distributed -n 2 --config zero{stage}.yaml --return result\n{FROM_CONFIG}", timeout=420).ok()
    got = json.loads(kernel.run("import json; print(json.dumps(result))").ok().stdout)
    assert (got["engine"], got["optimizer"]) == ("DeepSpeedEngine", ZERO_OPTIMIZER[stage])
    assert got["losses"] == pytest.approx(expected[stage]["losses"], rel=1e-5)


def test_a_deepspeed_plugin_written_in_the_cell_runs_deepspeed_on_cpu_ranks(workdir, kernel):
    _, expected = workdir
    kernel.run(f"%%distributed -n 2 --return result\n{FROM_PLUGIN}", timeout=420).ok()
    got = json.loads(kernel.run("print(json.dumps(result))").ok().stdout)
    assert (got["engine"], got["optimizer"]) == ("DeepSpeedEngine", "DeepSpeedZeroOptimizer")
    assert got["losses"] == pytest.approx(expected[2]["losses"], rel=1e-5)


def fp16_config(tmp_path) -> str:
    """ZeRO-2 in fp16 from a DeepSpeed JSON: the training code passes no dataloader, so the micro-batch size must be
    written there (Accelerate's plugin keys cannot set it), and with a JSON Accelerate refuses ``mixed_precision`` in
    its own config: fp16 is the JSON's ``fp16.enabled``, which nblaunch's refusal reads too."""
    (tmp_path / "fp16.json").write_text(json.dumps({**ds_json(2), "fp16": {"enabled": True}}))
    cfg = accelerate_config(2, 29743)
    cfg["deepspeed_config"] = {"deepspeed_config_file": str(tmp_path / "fp16.json"), "zero3_init_flag": False}
    (tmp_path / "fp16.yaml").write_text(yaml.safe_dump(cfg))
    return str(tmp_path / "fp16.yaml")


FP16_REFUSED = r"DeepSpeed on CPU runs fp16 only where .*Nothing was started"


def test_fp16_deepspeed_on_cpu_ranks_runs_where_this_cpu_has_fp16_kernels_and_is_refused_where_not(
    in_workdir, tmp_path
):
    """The branch this machine takes, for real: with fp16 kernels (AVX512-FP16, AMX-FP16) DeepSpeed trains in fp16
    and gives `accelerate launch`'s losses; without them the launch is refused before any rank starts (measured
    under accelerate launch: both ranks start, then stop in prepare() with "Type fp16 is not supported on your
    device" about 30 s later)."""
    config = fp16_config(tmp_path)
    if not hardware.cpu_has_fp16_kernels():
        with pytest.raises(LaunchConfigError, match=FP16_REFUSED):
            notebook_launcher(train_from_config, num_processes=2, config=config)
        return
    (tmp_path / "train.py").write_text(SCRIPT + LEAVE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELERATE_")}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", config, str(tmp_path / "train.py")]
    ref = subprocess.run(cmd, cwd=in_workdir, env=env, capture_output=True, text=True, timeout=420)
    assert ref.returncode == 0, f"accelerate launch, fp16:\n{(ref.stdout + ref.stderr)[-3000:]}"
    expected = json.loads(next(ln for ln in ref.stdout.splitlines() if ln.startswith("RESULT "))[7:])
    got = notebook_launcher(train_from_config, num_processes=2, config=config)
    assert (got["engine"], expected["engine"]) == ("DeepSpeedEngine", "DeepSpeedEngine")
    assert got["losses"] == pytest.approx(expected["losses"], rel=1e-5)


@pytest.mark.parametrize("has_fp16_kernels", [True, False], ids=["cpu-with-fp16-kernels", "cpu-without"])
def test_the_fp16_refusal_follows_the_cpus_answer_whichever_it_is(has_fp16_kernels, in_workdir, tmp_path, monkeypatch):
    """The other branch, by injecting the hardware answer where nblaunch asks it (``launch.hardware``): the ranks'
    environment for fp16 DeepSpeed on CPU, or the refusal, as the CPU's answer says."""
    from kernelside.config import resolve_config
    from kernelside.launch.accelerate_env import accelerate_env

    monkeypatch.setattr(hardware, "cpu_has_fp16_kernels", lambda: has_fp16_kernels)
    values = resolve_config({}, config=fp16_config(tmp_path)).values
    if has_fp16_kernels:
        env = accelerate_env(values, use_cpu=True)
        assert env["ACCELERATE_USE_DEEPSPEED"] == "true"
        assert env["ACCELERATE_DEEPSPEED_CONFIG_FILE"].endswith("fp16.json")
    else:
        with pytest.raises(LaunchConfigError, match=FP16_REFUSED):
            accelerate_env(values, use_cpu=True)


def test_deepspeed_not_installed_fails_the_cell_before_any_rank_starts(workdir, tmp_path, new_kernel):
    root, _ = workdir
    k = new_kernel(load_ext=False, cwd=str(root), env={"HF_HOME": str(root / "hf")})
    # the kernel's Python cannot import deepspeed, as where it is not installed (sys.modules None entry)
    k.run("import sys; sys.modules['deepspeed'] = None\n%load_ext kernelside").ok()
    cell = k.run(f"%%distributed -n 2 --config zero2.yaml\nprint('a rank started')\n{FROM_CONFIG}", timeout=120)
    assert cell.error is not None and "a rank started" not in cell.stdout
    shown = cell.error["evalue"] + "".join(cell.error.get("traceback", []))
    assert "DeepSpeed is not installed" in shown and "pip install deepspeed" in shown
    assert "Nothing was started" in shown
