"""Any rank's debugger from the cell, in a real kernel with stdin answered as JupyterLab answers it:
breakpoint() and torch.distributed.breakpoint(rank=N) on rank 1, two ranks stopping at once, and
%debug after a one-shot failure."""

from __future__ import annotations

import pytest
from harness import answers


@pytest.fixture(scope="module")
def kernel(kernel_with, tmp_path_factory):
    return kernel_with(cwd=tmp_path_factory.mktemp("debugger"))


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_breakpoint_on_rank_1_prompts_in_the_cell_with_the_rank_and_shows_its_frame(kernel, start_method):
    cell = kernel.run(
        f"""%%distributed -n 2 --start-method {start_method}
x = 10 * (rank + 1)
if rank == 1:
    breakpoint()
    y = x + 1
import torch.distributed as dist
dist.barrier()
""",
        on_input=answers("p x", "n", "p y", "c"),
        timeout=90,
    ).ok()
    assert [r["prompt"] for r in cell.input_requests] == ["(rank 1) (Pdb) "] * 4
    lines = cell.stdout.splitlines()
    listing = [ln for ln in lines if ln.startswith("> ")]
    assert listing and listing[0].startswith("> <%%distributed cell In[") and listing[0].endswith("]>(5)<module>()")
    assert "-> y = x + 1" in lines
    assert "20" in lines and "21" in lines  # rank 1's x and y, printed by its debugger in the cell


def test_torch_distributed_breakpoint_on_rank_1_holds_every_rank_and_restores_the_timeout(kernel):
    cell = kernel.run(
        """%%distributed -n 2
import datetime, torch, torch.distributed as dist
timeout = lambda: str(dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu")).options._timeout)
dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=5))  # (nblaunch's own is 2 h: never lowered)
before = timeout()
secret = 7 * rank
dist.breakpoint(rank=1)
t = torch.ones(1)
dist.all_reduce(t)
(before, timeout(), t.item())
""",
        on_input=answers("p secret", "p timeout()", "c"),
        timeout=90,
    ).ok()
    assert [r["prompt"] for r in cell.input_requests] == ["(rank 1) (Pdb) "] * 3
    lines = cell.stdout.splitlines()
    assert "7" in lines  # rank 1's own frame: no `up` needed
    assert "'1:00:00'" in lines  # while the debugger is open, the group waits an hour
    assert cell.result["text/plain"] == "('0:05:00', '0:05:00', 2.0)"  # and after it, what it was


def test_two_ranks_stopping_at_once_are_served_one_prompt_at_a_time_each_labelled(kernel):
    asked: dict[str, int] = {}

    def answer(prompt, password):
        asked[prompt] = asked.get(prompt, 0) + 1
        return "p who" if asked[prompt] == 1 else "c"

    cell = kernel.run(
        """%%distributed -n 2
who = f"I am rank {rank}"
breakpoint()
import torch.distributed as dist
dist.barrier()
""",
        on_input=answer,
        timeout=90,
    ).ok()
    prompts = [r["prompt"] for r in cell.input_requests]
    assert sorted(prompts) == ["(rank 0) (Pdb) "] * 2 + ["(rank 1) (Pdb) "] * 2
    assert "'I am rank 0'" in cell.stdout.splitlines() and "'I am rank 1'" in cell.stdout.splitlines()


def test_debug_after_a_one_shot_failure_says_in_one_line_how_to_reach_the_rank(kernel):
    cell = kernel.run("%%distributed -n 2\nif rank == 1:\n    raise ValueError('boom')\n", timeout=90)
    assert cell.error is not None and cell.error["ename"] == "WorkerError"
    debug = kernel.run("%debug", on_input=answers("q"), timeout=30).ok()
    assert debug.input_requests == []  # no debugger was opened on nblaunch's frames
    assert debug.stdout.strip().splitlines() == [
        "nblaunch: %debug cannot open rank 1's frame: it ran in a launch whose ranks have exited. Run the cell in "
        "a live session (%distributed_start, then the cell again) and %debug opens the failed rank's frame there; "
        "its traceback is above."
    ]


def test_debug_after_any_other_exception_is_ipythons_own(kernel):
    kernel.run("def f():\n    local = 41\n    1 / 0\nf()")
    debug = kernel.run("%debug", on_input=answers("p local", "q"), timeout=30).ok()
    assert [r["prompt"] for r in debug.input_requests] == ["ipdb> "] * 2
    assert "41" in debug.stdout


def test_breakpoint_on_rank_1_in_a_live_cell_prompts_and_the_ranks_keep_their_state(kernel):
    kernel.run("%distributed_start -n 2").ok()
    try:
        kernel.run("%%distributed\nkept = 100 + rank").ok()
        cell = kernel.run(
            "%%distributed\nif rank == 1:\n    breakpoint()\n    seen = kept\nimport torch.distributed as dist\n"
            "dist.barrier()\n",
            on_input=answers("p kept", "c"),
            timeout=90,
        ).ok()
        assert [r["prompt"] for r in cell.input_requests] == ["(rank 1) (Pdb) "] * 2
        assert "101" in cell.stdout.splitlines()
        after = kernel.run("%%distributed --return kept\nkept").ok()
        assert after.result["text/plain"] == "100"
    finally:
        kernel.run("%distributed_stop").ok()


def test_q_in_torch_distributed_breakpoint_on_rank_1_stops_the_launch_naming_the_rank(kernel):
    cell = kernel.run(
        "%%distributed -n 2\nimport torch.distributed as dist\ndist.breakpoint(rank=1)\nprint('not reached')\n",
        on_input=answers("q"),
        timeout=90,
    )
    assert cell.error is not None
    text = "\n".join(cell.error["traceback"])
    assert "the debugger on rank 1 was quit (q); the launch was stopped on every rank" in text
    assert "not reached" not in cell.stdout
