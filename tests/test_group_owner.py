"""The default process group is nblaunch's to its end: user code's destroy_process_group() of it
(Accelerate's end_training()) never hangs a rank's exit, and a live session's next cell still has
a working group. The 200-launch soak is ``bench/end_training_soak.py``; here, a short one."""

from __future__ import annotations

import pytest

from bench.end_training_soak import CELL, train_and_end
from kernelside import notebook_launcher

LAUNCHES = 12

pytestmark = pytest.mark.processes  # every test here launches ranks


def test_end_training_after_an_accelerate_prepared_model_never_hangs_a_launch():
    # before nblaunch kept the group, most of these launches hung at the rank's exit (bench/README.md)
    for i in range(LAUNCHES):
        loss = notebook_launcher(train_and_end, num_processes=2, timeout=30)
        assert isinstance(loss, float), f"launch {i + 1}"


def destroy_a_group_of_its_own():
    import torch
    import torch.distributed as dist
    from torch.distributed import destroy_process_group

    g = dist.new_group([0, 1])
    t = torch.ones(1)
    dist.all_reduce(t, group=g)
    destroy_process_group(g)  # the user's own group: destroyed as asked
    gone = g not in dist.distributed_c10d._world.pg_map
    destroy_process_group()  # the default group: nblaunch's, it stays up
    dist.all_reduce(t)
    return t.item(), dist.is_initialized(), gone


def test_destroy_takes_down_a_users_own_group_but_leaves_the_default_one_working():
    assert notebook_launcher(destroy_a_group_of_its_own, num_processes=2, timeout=60) == (4.0, True, True)


GROUP_TIMEOUTS = (
    "%%distributed -n 2\nimport datetime, torch, torch.distributed as dist\n"
    "from kernelside.worker.live_rescue import group_timeout\n"
    "before = group_timeout(dist.distributed_c10d._get_default_group())\n"
    "dist.init_process_group('gloo', timeout=datetime.timedelta(seconds=42))  # code written for torchrun\n"
    "after = group_timeout(dist.distributed_c10d._get_default_group())\n"
    "t = torch.ones(1)\ndist.all_reduce(t)\n"
    "(before.total_seconds(), after.total_seconds(), t.item())"
)


@pytest.fixture(scope="module")
def kernel(kernel_with, tmp_path_factory):
    return kernel_with(cwd=tmp_path_factory.mktemp("group_owner"))


def test_end_training_in_distributed_cells_never_hangs(kernel):
    for i in range(LAUNCHES):
        cell = kernel.run(CELL.format(timeout=30), timeout=60)
        assert cell.error is None, (i + 1, cell.error)


def test_a_live_cell_after_end_training_has_a_working_default_group(kernel):
    kernel.run("%distributed_start -n 2").ok()
    try:
        kernel.run(CELL.format(timeout=30) + "world_before = accelerator.num_processes\n", timeout=60).ok()
        cell = kernel.run(
            "%%distributed\nimport torch.distributed as dist\nt = torch.ones(1)\ndist.all_reduce(t)\n"
            "(t.item(), dist.get_world_size(), world_before)",
            timeout=60,
        ).ok()
        assert cell.result["text/plain"] == "(2.0, 2, 2)"
    finally:
        kernel.run("%distributed_stop").ok()


def test_the_group_waits_two_hours_in_a_collective_unless_the_users_init_says_otherwise(kernel):
    # a person may debug one rank while its peers wait: torch's 10 min (NCCL) / 30 min (gloo) would end them
    cell = kernel.run(GROUP_TIMEOUTS, timeout=60).ok()
    assert cell.result["text/plain"] == "(7200.0, 42.0, 2.0)"
