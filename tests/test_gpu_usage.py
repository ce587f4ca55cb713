"""Per-rank GPU figures in the run report (kernelside/launch/gpu_usage.py) on a machine without GPUs.

Here NVML is absent (nvidia-ml-py is installed, the driver library is not): the sampler must be the
no-op one and a launch's report must carry no GPU columns, without an error. The device mapping
and the pid-to-rank mapping are pure functions, checked on crafted inputs; the sampling itself is
checked on a GPU by tests/gpu/test_gpu_launch.py.
"""

from __future__ import annotations

import os

import pytest

from kernelside import last_report, notebook_launcher
from kernelside.launch import gpu_usage
from kernelside.launch.report import LaunchReport, RankReport

UUIDS = ["GPU-3f2a91c0-1111-2222-3333-444455556666", "GPU-a07bd3e4-aaaa-bbbb-cccc-ddddeeeeffff", "GPU-a07c0000-0"]


def test_without_nvml_the_sampler_is_the_no_op_one_and_says_why():
    sampler = gpu_usage.sampler_for((0,))
    assert sampler.available is False
    ranks = [RankReport(rank=0, pid=os.getpid(), log_path="/dev/null")]
    sampler.sample(ranks)
    sampler.tick(ranks, now=1e12)
    assert (ranks[0].gpu_index, ranks[0].gpu_memory_bytes, ranks[0].gpu_util_percent) == (None, None, None)
    assert gpu_usage.nvml_unavailable_reason().startswith(("NVML:", "nvidia-ml-py"))


@pytest.mark.usefixtures("no_leaks")
def test_a_cpu_launch_report_has_no_gpu_columns():
    notebook_launcher(os.getpid, num_processes=1)
    report = last_report()
    assert all(r.gpu_index is None and r.gpu_memory_bytes is None for r in report.ranks)
    assert "GPU memory" not in report._repr_markdown_()


def test_report_shows_gpu_columns_only_when_a_rank_has_figures():
    rep = LaunchReport(world_size=2, backend="nccl", start_method="fork", port=1, log_dir="/tmp/x", started_at=0.0)
    rep.ranks = [
        RankReport(rank=0, pid=10, log_path="a", gpu_index=0, gpu_memory_bytes=3 * 2**30, gpu_util_percent=87.5),
        RankReport(rank=1, pid=11, log_path="b", gpu_index=1),
    ]
    md = rep._repr_markdown_()
    assert "| GPU | GPU memory (MiB) | GPU util (%) |" in md
    assert "| 0 | 3072 | 87.5 |" in md and "| 1 | - | - |" in md


@pytest.mark.parametrize(
    "cvd, expected",
    [
        (None, [0, 1, 2]),
        ("2,0", [2, 0]),
        ("1,7,0", [1]),  # CUDA stops at the first entry that names no GPU
        ("GPU-3f2a,2", [0, 2]),  # a unique UUID prefix, as CUDA accepts it
        ("GPU-a07", []),  # an ambiguous prefix names no GPU
        ("gpu-A07BD3E4-AAAA-BBBB-CCCC-DDDDEEEEFFFF", [1]),
        ("0,0", [0]),
        ("", []),
        ("-1", []),
        ("MIG-4b6a7c1e-0000-0000-0000-000000000000", []),
    ],
)
def test_cuda_visible_devices_map_to_nvml_devices_as_cuda_reads_them(cvd, expected):
    assert gpu_usage.visible_nvml_indices(cvd, UUIDS) == expected


def test_gpu_processes_count_for_the_rank_whose_worker_started_them():
    parents = {500: 100, 501: 500, 700: 1, 800: 101}  # 501: a DataLoader worker's child; 700: someone else's
    found = gpu_usage.ranks_of([100, 501, 700, 800, 999], {100: 0, 101: 1}, parents.get)
    assert found == {100: 0, 501: 0, 800: 1}


def test_parent_pid_reads_proc():
    assert gpu_usage.parent_pid(os.getpid()) == os.getppid()
    assert gpu_usage.parent_pid(2**22 + 12345) is None
