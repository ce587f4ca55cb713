"""Any rank's debugger on GPUs, in a real kernel with stdin answered as JupyterLab answers it (the CPU
version is tests/test_rank_debugger.py): ``breakpoint()`` on a rank of an NCCL world whose peers wait in
an NCCL collective, ``torch.distributed.breakpoint`` raising and restoring the NCCL group's timeout, and
``breakpoint()`` on rank 1 of two ranks sharing one card through gloo.

NCCL needs a GPU per rank (nblaunch refuses ``backend='nccl'`` with more ranks than GPUs, and NCCL
itself refuses two ranks on one device), so the NCCL cells run one rank per GPU and stop the last one:
rank 1 from two GPUs on, the only rank on one GPU. Rank 1 with peers on one card is the gloo test.
"""

from __future__ import annotations

import pytest
from harness import answers

pytestmark = pytest.mark.usefixtures("gpu_left_clean")


@pytest.fixture(scope="module")
def kernel(kernel_with, tmp_path_factory):
    return kernel_with(cwd=tmp_path_factory.mktemp("gpu-debugger"))


def test_breakpoint_on_the_last_nccl_rank_prompts_in_the_cell_and_its_collective_completes(kernel, gpus):
    stop = gpus - 1  # rank 1 from two GPUs on
    cell = kernel.run(
        f"""%%distributed -n {gpus} --backend nccl
import torch, torch.distributed as dist
x = torch.full((1,), 10.0 * (rank + 1), device="cuda")
if rank == {stop}:
    breakpoint()
    y = x.item() + 1
dist.all_reduce(x)  # the other ranks wait here, in NCCL, for the rank in the debugger
(dist.get_backend(), x.device.type, x.item())
""",
        on_input=answers("p x.item()", "n", "p y", "c"),
        timeout=180,
    ).ok()
    assert [r["prompt"] for r in cell.input_requests] == [f"(rank {stop}) (Pdb) "] * 4
    lines = cell.stdout.splitlines()
    assert "-> y = x.item() + 1" in lines
    assert f"{10.0 * (stop + 1)}" in lines and f"{10.0 * (stop + 1) + 1}" in lines  # x and y of that rank
    total = sum(10.0 * (r + 1) for r in range(gpus))
    assert cell.result["text/plain"] == repr(("nccl", "cuda", total))


def test_torch_distributed_breakpoint_raises_the_nccl_timeout_while_open_and_restores_it(kernel, gpus):
    stop = gpus - 1
    cell = kernel.run(
        f"""%%distributed -n {gpus} --backend nccl
import datetime, torch, torch.distributed as dist
timeout = lambda: str(dist.distributed_c10d._get_default_group()._get_backend(torch.device("cuda")).options._timeout)
dist.init_process_group("nccl", timeout=datetime.timedelta(minutes=5))  # (nblaunch's own is 2 h: never lowered)
before = timeout()
secret = 7 * (rank + 1)
dist.breakpoint(rank={stop})
t = torch.ones(1, device="cuda")
dist.all_reduce(t)
(before == timeout(), before, t.item())
""",
        on_input=answers("p secret", "p timeout()", "c"),
        timeout=180,
    ).ok()
    assert [r["prompt"] for r in cell.input_requests] == [f"(rank {stop}) (Pdb) "] * 3
    lines = cell.stdout.splitlines()
    assert str(7 * (stop + 1)) in lines  # that rank's own frame: no `up` needed
    assert "'1:00:00'" in lines  # while the debugger is open, the NCCL group waits an hour
    restored, before, total = eval(cell.result["text/plain"])
    assert restored and before == "0:05:00", before  # and after it, what it was
    assert total == float(gpus)


def test_breakpoint_on_rank_1_of_two_ranks_sharing_one_gpu_through_gloo(kernel):
    cell = kernel.run(
        """%%distributed -n 2 --gpu-ids 0
import torch, torch.distributed as dist
x = torch.full((1,), 10.0 * (rank + 1), device="cuda")
if rank == 1:
    breakpoint()
    y = x.item() + 1
dist.all_reduce(x)
(dist.get_backend(), str(x.device), x.item())
""",
        on_input=answers("p x.item()", "n", "p y", "c"),
        timeout=180,
    ).ok()
    assert [r["prompt"] for r in cell.input_requests] == ["(rank 1) (Pdb) "] * 4
    lines = cell.stdout.splitlines()
    assert "-> y = x.item() + 1" in lines
    assert "20.0" in lines and "21.0" in lines  # rank 1's x and y, printed by its debugger in the cell
    assert cell.result["text/plain"] == repr(("gloo", "cuda:0", 30.0))
