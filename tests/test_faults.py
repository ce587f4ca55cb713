"""The fault matrix: each failure gives a clear error naming rank and cause, returns promptly,
leaves nothing behind (the no_leaks fixture), and the next launch works."""

from __future__ import annotations

import fcntl
import os
import sys
import threading
import time
import types

import pytest
import torch

from kernelside import LaunchError, LaunchTimeoutError, WorkerError, last_report, notebook_launcher

pytestmark = pytest.mark.usefixtures("no_leaks")


def rank_and_world():
    import torch.distributed as dist

    return dist.get_rank(), dist.get_world_size()


def expect_failure(fn, *, args=(), rank=None, fragment, within=5.0, error=WorkerError, **kwargs):
    t0 = time.monotonic()
    with pytest.raises(error) as info:
        notebook_launcher(fn, args=args, num_processes=kwargs.pop("num_processes", 2), **kwargs)
    elapsed = time.monotonic() - t0
    assert elapsed < within, f"took {elapsed:.1f}s"
    if rank is not None:
        assert info.value.rank == rank
    assert fragment in str(info.value), str(info.value)
    assert notebook_launcher(rank_and_world, num_processes=2) == (0, 2)  # the next launch works
    return info.value


def fail_after_training():
    import torch.distributed as dist

    t = torch.ones(3)
    for _ in range(5):
        dist.all_reduce(t)
    if dist.get_rank() == 1:
        raise RuntimeError("evaluation failed after training")


def test_exception_after_the_last_collective():
    expect_failure(fail_after_training, rank=1, fragment="RuntimeError: evaluation failed after training")


def fail_all_at_once():
    import torch.distributed as dist

    dist.barrier()
    raise ValueError(f"every rank fails (rank {dist.get_rank()})")


def test_exception_in_all_ranks_at_once_names_one_root_cause():
    err = expect_failure(fail_all_at_once, fragment="ValueError: every rank fails", num_processes=3)
    assert err.rank in (0, 1, 2)
    assert str(err).startswith(f"nblaunch: rank {err.rank} failed: ValueError: every rank fails (rank {err.rank})")


def test_exception_before_the_process_group_is_up_under_spawn():
    # a function from a module that exists only in this process cannot be imported by a spawned worker
    mod = types.ModuleType("only_in_this_kernel")
    exec("def work():\n    return 1\n", mod.__dict__)
    sys.modules["only_in_this_kernel"] = mod
    try:
        err = expect_failure(mod.work, start_method="spawn", within=30, fragment="during unpickle")
    finally:
        del sys.modules["only_in_this_kernel"]
    assert "ModuleNotFoundError: No module named 'only_in_this_kernel'" in str(err)


def close_stdout_then_print():
    import torch.distributed as dist

    if dist.get_rank() == 1:
        os.close(1)
        print("this cannot be written", flush=True)
    dist.barrier()


def test_rank_that_closes_its_stdout():
    expect_failure(close_stdout_then_print, rank=1, fragment="rank 1 failed: OSError")


def skip_one_allreduce(then_exit):
    import torch.distributed as dist

    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(1))  # rank 1 never joins
    elif not then_exit:
        time.sleep(600)  # rank 1 is busy elsewhere


def test_collective_mismatch_is_stopped_by_timeout():
    expect_failure(
        skip_one_allreduce, args=(False,), fragment="exceeded timeout=2s", error=LaunchTimeoutError, timeout=2
    )


def test_rank_that_returns_while_a_peer_waits_in_a_collective_is_named():
    err = expect_failure(skip_one_allreduce, args=(True,), rank=0, fragment="Connection")
    assert "rank(s) 1 had already finished normally. Did one rank skip a collective" in str(err)


def return_a_lock():
    return threading.Lock()


def test_result_that_cannot_be_pickled_says_what_to_return_instead():
    expect_failure(return_a_lock, rank=0, fragment="rank 0's return value could not be sent back: TypeError")


def return_big(mb):
    return torch.ones(mb * 1024 * 1024 // 4)


def test_large_result_arrives_whole():
    mb = 1024
    value = notebook_launcher(return_big, args=(mb,), num_processes=2)
    assert value.numel() * 4 == mb * 1024 * 1024 and float(value[-1]) == 1.0


class FakeCudaTensor(torch.Tensor):
    """Reports a CUDA device, as a GPU tensor would; its data is on CPU so this runs anywhere."""

    @property
    def device(self):
        return torch.device("cuda", 0)


def return_device_tensors():
    t = torch.arange(4.0).as_subclass(FakeCudaTensor)
    return {"weights": t, "nested": [t * 2]}


def test_result_tensors_reporting_a_gpu_come_back_as_plain_cpu_tensors():
    value = notebook_launcher(return_device_tensors, num_processes=2)
    assert type(value["weights"]) is torch.Tensor and value["weights"].device.type == "cpu"
    assert value["weights"].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert type(value["nested"][0]) is torch.Tensor


def slow(seconds):
    time.sleep(seconds)
    return "slow done"


def test_two_launches_at_once_from_two_threads_the_second_is_refused():
    from kernelside.launch.request import LaunchRequest
    from kernelside.launch.runner import launch

    running = threading.Event()
    results = {}

    def first():
        req = LaunchRequest(
            fn=slow,
            args=(3,),
            arguments={"num_processes": 2},
            on_event=lambda rank, kind, payload: kind == "ready" and running.set(),
        )
        results["first"] = launch(req).value

    t = threading.Thread(target=first)
    t.start()
    assert running.wait(30)
    with pytest.raises(LaunchError, match="another nblaunch launch is already running in this kernel"):
        notebook_launcher(rank_and_world, num_processes=2)
    t.join()
    assert results["first"] == "slow done"


def return_object_of_a_worker_only_module():
    mod = types.ModuleType("exists_only_in_the_worker")
    exec("class Result:\n    pass\n", mod.__dict__)
    sys.modules["exists_only_in_the_worker"] = mod
    return mod.Result()


def test_result_the_kernel_cannot_rebuild_is_a_clear_error():
    expect_failure(
        return_object_of_a_worker_only_module,
        rank=0,
        fragment="rank 0's return value arrived but cannot be rebuilt in the kernel: ModuleNotFoundError",
    )


def test_old_run_logs_are_pruned_to_the_newest_fifty(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    for i in range(60):
        (logs / f"run-20200101-0000{i:02d}-x").mkdir()
    (logs / "notes").mkdir()  # not a run folder: left alone
    live = logs / "run-20200101-000003-x"  # the oldest but one, still running in another kernel
    lock = os.open(live / ".in-use", os.O_CREAT | os.O_RDWR)
    fcntl.flock(lock, fcntl.LOCK_EX)
    cfg = tmp_path / "nblaunch.yaml"
    cfg.write_text(f"log_dir: {logs}\n")
    try:
        notebook_launcher(rank_and_world, num_processes=2, config=str(cfg))
    finally:
        os.close(lock)
    runs = sorted(p.name for p in logs.iterdir() if p.name.startswith("run-"))
    assert live.name in runs
    assert len(runs) == 51
    assert runs[1] == "run-20200101-000011-x"  # the eleven oldest that were not in use went
    assert os.path.dirname(last_report().log_dir) == str(logs) and (logs / "notes").is_dir()
