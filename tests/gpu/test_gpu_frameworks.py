"""What users bring to the GPU: Accelerate inside a rank, %%distributed from IPython, and a real Jupyter kernel."""

from __future__ import annotations

import textwrap

import pytest
from gpu_scenario import run_scenario

from kernelside import notebook_launcher

pytestmark = pytest.mark.usefixtures("gpu_left_clean", "no_leaks")  # NVML is up before the fd census


def accelerate_training(steps=10):
    import os

    import torch
    from accelerate import Accelerator

    acc = Accelerator()  # reads ACCELERATE_MIXED_PRECISION and the process group nblaunch set up
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model, opt = acc.prepare(model, opt)
    x = torch.randn(32, 64, device=acc.device)
    y = x.mean(1, keepdim=True)
    losses = []
    for _ in range(steps):
        with acc.autocast():
            out = model(x)  # prepare() hands outputs back in fp32: the autocast dtype shows inside
            autocast_dtype = str(torch.get_autocast_dtype("cuda")) if torch.is_autocast_enabled("cuda") else None
            matmul_dtype = str((x @ x.T).dtype)
            loss = torch.nn.functional.mse_loss(out.float(), y)
        opt.zero_grad()
        acc.backward(loss)
        opt.step()
        losses.append(loss.item())
    return {
        "device": str(acc.device),
        "local_rank": int(os.environ["LOCAL_RANK"]),
        "current_device": torch.cuda.current_device(),
        "mixed_precision": acc.mixed_precision,
        "autocast_dtype": autocast_dtype,
        "matmul_dtype": matmul_dtype,
        "scaler": type(acc.scaler).__name__ if acc.scaler is not None else None,
        "param_device": str(next(model.parameters()).device),
        "distributed_type": str(acc.distributed_type),
        "losses": losses,
    }


@pytest.mark.parametrize("precision, dtype", [("bf16", "torch.bfloat16"), ("fp16", "torch.float16")])
def test_accelerator_in_a_rank_uses_its_gpu_and_the_mixed_precision_asked_for(gpus, precision, dtype):
    values = notebook_launcher(accelerate_training, num_processes=gpus, mixed_precision=precision, return_all=True)
    for v in values:
        assert v["device"] in (f"cuda:{v['local_rank']}", "cuda") and v["current_device"] == v["local_rank"], v
        assert v["param_device"] == f"cuda:{v['local_rank']}", v
        assert v["mixed_precision"] == precision
        assert v["autocast_dtype"] == dtype and v["matmul_dtype"] == dtype, v
        assert v["losses"][-1] < v["losses"][0], v["losses"]
        if precision == "fp16":
            assert v["scaler"] == "GradScaler", v
        else:
            assert v["scaler"] is None, v


NET = """
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)
    def forward(self, x):
        return self.lin(x)
data = torch.randn(64, 4), torch.randn(64, 1)
"""

TRAIN_CELL = """%%distributed --return model,losses
torch.manual_seed(0)
model = DDP(Net().to(device), device_ids=[device.index])
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = data[0][rank::world_size].to(device), data[1][rank::world_size].to(device)
losses = []
for step in range(5):
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
    losses.append(loss.item())
print(f"rank {rank}/{world_size} trained on {next(model.parameters()).device}")
str(next(model.parameters()).device)
"""

IPYTHON_SESSION = f"""
import json
import torch
from IPython.core.interactiveshell import InteractiveShell
from kernelside.launch import cuda_guard

ip = InteractiveShell.instance()
ip.run_line_magic("load_ext", "kernelside")
ip.run_cell({NET!r}).raise_error()
cell = ip.run_cell({TRAIN_CELL!r})
cell.raise_error()
model = ip.user_ns["model"]
print("RESULT " + json.dumps({{
    "is_net": isinstance(model, ip.user_ns["Net"]),
    "devices": sorted({{str(p.device) for p in model.parameters()}}),
    "losses": ip.user_ns["losses"],
    "cell_result": cell.result,
    "torch_initialized": torch.cuda.is_initialized(),
    "detected": cuda_guard.is_cuda_initialized(),
}}))
"""


def test_distributed_magic_from_ipython_returns_the_model_on_cpu(tmp_path, gpus):
    facts, run = run_scenario(tmp_path, IPYTHON_SESSION, name="ipython_session.py")
    assert f"rank 0/{gpus} trained on cuda:0" in run.stdout, run.stdout
    assert facts["cell_result"] == "cuda:0"
    assert facts["is_net"] and facts["devices"] == ["cpu"]
    assert facts["losses"][-1] < facts["losses"][0]
    assert facts["torch_initialized"] is False and facts["detected"] is False


@pytest.mark.kernel
def test_jupyter_kernel_gets_the_model_back_on_cpu_without_initializing_cuda(gpus):
    from kernel import Kernel  # tests/kernel.py: a real ipykernel through jupyter_client

    k = Kernel()
    try:
        k.run("%load_ext kernelside").ok()
        k.run(NET).ok()
        cell = k.run(TRAIN_CELL, timeout=120).ok()
        assert f"rank 0/{gpus} trained on cuda:0" in cell.stdout, cell.stdout
        check = k.run(
            textwrap.dedent("""\
                from kernelside import last_report
                from kernelside.launch import cuda_guard
                print(sorted({str(p.device) for p in model.parameters()}), type(model).__name__,
                      torch.cuda.is_initialized(), cuda_guard.is_cuda_initialized(), last_report().backend)
            """)
        ).ok()
        assert check.stdout.strip() == "['cpu'] Net False False nccl", check.stdout
    finally:
        k.shutdown()
