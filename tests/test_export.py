"""%distributed_export: the exported script, run by the printed torchrun command, gives the cell's result."""

from __future__ import annotations

import shlex
import sys

import pytest
from netns import run_isolated

NOTEBOOK = """
import threading
import torch
import torch.nn as nn
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from kernelside import notebook_launcher, progress

SCALE = 0.5

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 1)
    def forward(self, x):
        return self.lin(x) * SCALE

def loss_fn(out, y):
    return nn.functional.mse_loss(out, y)

class Shard:  # a notebook class that only the data refers to
    def __init__(self, x, y):
        self.x, self.y = x, y

torch.manual_seed(0)
shards = [Shard(torch.randn(32, 4), torch.randn(32, 1)) for _ in range(2)]
lock = threading.Lock()

def train(steps):
    torch.manual_seed(1)
    model = DDP(Net())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    s = shards[dist.get_rank()]
    for _ in range(steps):
        loss = loss_fn(model(s.x), s.y)
        opt.zero_grad(); loss.backward(); opt.step()
    t = torch.tensor([loss.item()]); dist.all_reduce(t)
    return round(t.item(), 6)
"""

CELL = """%%distributed -n 2 --port {port}
torch.manual_seed(1)
model = DDP(Net())
opt = torch.optim.SGD(model.parameters(), lr=0.1)
s = shards[rank]
for step in progress(range(5), desc="train"):
    loss = loss_fn(model(s.x), s.y)
    opt.zero_grad(); loss.backward(); opt.step()
t = torch.tensor([loss.item()]); dist.all_reduce(t)
(round(t.item(), 6), world_size,
 sorted(n for n, p in model.module.named_parameters()))
"""


@pytest.fixture(scope="module")
def kernel(kernel_with):
    return kernel_with(NOTEBOOK)


def _torchrun(shown: str, cwd) -> str:
    """Run the torchrun command the export printed (torchrun as ``python -m torch.distributed.run``)."""
    line = next(ln.strip() for ln in shown.splitlines() if ln.strip().startswith("torchrun "))
    argv = [sys.executable, "-m", "torch.distributed.run", *shlex.split(line)[1:]]
    proc = run_isolated(argv, timeout=120, cwd=cwd)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


def test_exported_cell_run_by_the_printed_torchrun_command_gives_the_cells_result(kernel, tmp_path, free_port):
    cell = kernel.run(CELL.format(port=free_port)).ok()
    shown = kernel.run(f"%distributed_export {tmp_path / 'train.py'}").ok().stdout
    assert (
        f"torchrun --nnodes 1 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:{free_port} train.py"
        in shown
    )
    assert "accelerate launch --multi_gpu --num_processes 2 --num_machines 1" in shown
    assert "note:" not in shown
    script = (tmp_path / "train.py").read_text()
    assert "class Net(nn.Module):" in script and "def loss_fn(out, y):" in script and "class Shard:" in script
    assert "SCALE = 0.5" in script and "lock" not in script
    assert (tmp_path / "train.data.pkl").exists()
    out = _torchrun(shown, tmp_path)
    assert out.strip().splitlines()[-1] == cell.result["text/plain"]


def test_exported_function_with_arguments_matches_notebook_launcher(kernel, tmp_path, free_port):
    expected = kernel.run("notebook_launcher(train, args=(4,), num_processes=2)").ok().result["text/plain"]
    shown = kernel.run(f"%distributed_export {tmp_path / 'fn.py'} train --args '(4,)' --port {free_port}").ok().stdout
    assert f"--rdzv-endpoint 127.0.0.1:{free_port} fn.py" in shown
    assert _torchrun(shown, tmp_path).strip().splitlines()[-1] == expected


LEAVE_OPEN = """
KEPT = []

def leave_open():
    f = open(f"left_open_{dist.get_rank()}.txt", "w")  # never closed: a module-level list keeps it
    f.write("written by the rank")
    KEPT.append(f)
    return dist.get_rank()
"""


def test_an_exported_script_ends_as_a_script_does_files_left_open_are_written(kernel, tmp_path, free_port):
    # the script leaves without the interpreter's teardown (torch's gloo can abort there with DDP alive)
    kernel.run(LEAVE_OPEN).ok()
    shown = kernel.run(f"%distributed_export {tmp_path / 'lo.py'} leave_open --port {free_port}").ok().stdout
    assert _torchrun(shown, tmp_path).strip().splitlines()[-1] == "0"
    for r in range(2):
        assert (tmp_path / f"left_open_{r}.txt").read_text() == "written by the rank"


def test_data_that_cannot_be_pickled_is_named_in_a_note(kernel, tmp_path):
    kernel.run("%%distributed -n 2\nwith lock:\n    value = rank\n").ok()
    shown = kernel.run(f"%distributed_export {tmp_path / 'locked.py'}").ok().stdout
    assert "note: 'lock' (lock) could not be saved with pickle" in shown
    assert "Define lock in the script before running it." in shown
    assert "# NOTE: 'lock' (lock) could not be saved" in (tmp_path / "locked.py").read_text()


def test_export_of_a_name_that_is_not_a_notebook_function_is_refused(kernel, tmp_path):
    cell = kernel.run(f"%distributed_export {tmp_path / 'x.py'} SCALE")
    assert cell.error["ename"] == "LaunchConfigError"
    assert "export a notebook function by name" in cell.error["evalue"]
    assert not (tmp_path / "x.py").exists()
