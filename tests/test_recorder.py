"""The run recorder alone decides outcome and root cause, on the engine's clock: testable without a kernel.

Ray's ranks may run on other machines, so the Ray engine's recorder reads the wall-time stamp of
the workers' events and stamps its own observations (a timeout) on wall time too. Before there
was one recorder, the Ray path compared the workers' wall times with a monotonic timeout stamp,
so a timeout always looked earlier than any rank's error.
"""

from __future__ import annotations

import time

import pytest
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from kernelside.engines.contract import ExitStatus
from kernelside.engines.table import engine_class
from kernelside.errors import LaunchTimeoutError, WorkerError
from kernelside.launch.recorder import RunRecorder
from kernelside.launch.report import LaunchReport
from kernelside.worker.lifecycle import error_payload


def _report(n=2) -> LaunchReport:
    return LaunchReport(world_size=n, backend="gloo", start_method="ray", port=0, log_dir="/logs", started_at=0.0)


class _Tails:
    def tail(self, rank, n=20):
        return f"last line of rank {rank}\n"


def _error_from_rank(rank: int) -> dict:
    try:
        raise ValueError(f"broken shard on rank {rank}")
    except ValueError as e:
        return error_payload(e, "run")


def _recorder(clock: str, stops: list) -> RunRecorder:
    rec = RunRecorder(_report(), clock=clock, tails=_Tails(), stop=lambda: stops.append(time.monotonic()))
    rec.add_ranks([(0, 100), (1, 101)])
    return rec


def test_under_ray_a_rank_error_followed_by_a_timeout_names_the_rank():
    stops = []
    rec = _recorder(engine_class("ray").clock, stops)
    payload = _error_from_rank(1)  # raised first on the rank; the kernel hears of it after the timeout
    rec.timeout(5.0)
    rec.event(1, "error", payload)
    rec.close()
    with pytest.raises(WorkerError) as info:
        rec.outcome(return_all=False)
    assert info.value.rank == 1 and str(info.value).startswith("nblaunch: rank 1 failed: ValueError: broken shard")
    assert len(stops) == 1  # the engine was asked to stop once, at the first failure


def test_under_ray_a_timeout_followed_by_a_rank_error_names_the_timeout():
    stops = []
    rec = _recorder(engine_class("ray").clock, stops)
    rec.timeout(5.0)
    rec.event(1, "error", _error_from_rank(1))  # raised after the timeout, while the job was being stopped
    rec.close()
    with pytest.raises(LaunchTimeoutError) as info:
        rec.outcome(return_all=False)
    assert info.value.rank is None and "exceeded timeout=5s" in str(info.value)


def test_the_local_engine_compares_on_the_monotonic_clock():
    rec = _recorder(engine_class("local").clock, [])
    payload = _error_from_rank(0)
    rec.timeout(5.0)
    rec.event(0, "error", payload)
    with pytest.raises(WorkerError) as info:
        rec.outcome(return_all=False)
    assert info.value.rank == 0


def test_a_rank_stopped_by_our_sigterm_is_not_a_failure_but_its_own_exit_is():
    rec = _recorder("monotonic", [])
    rec.event(1, "error", _error_from_rank(1))
    rec.exited(0, ExitStatus(None, 15))  # our SIGTERM, after rank 1 failed
    assert [f.rank for f in rec.report.failures] == [1]
    assert rec.report.ranks[0].status.describe() == "killed by SIGTERM"


def test_a_rank_killed_while_the_others_are_being_stopped_is_its_own_failure():
    rec = _recorder("monotonic", [])
    rec.event(1, "error", _error_from_rank(1))
    rec.exited(0, ExitStatus(None, 9))  # SIGKILL during the grace period: not our SIGTERM (out of memory?)
    assert [(f.rank, f.message) for f in rec.report.failures][1] == (0, "killed by SIGKILL — out of memory?")


def test_worker_error_is_torchs_child_failed_error_with_the_failed_ranks():
    rec = _recorder("monotonic", [])
    rec.event(1, "error", _error_from_rank(1))
    rec.exited(1, ExitStatus(1, None))
    with pytest.raises(ChildFailedError) as info:
        rec.outcome(return_all=False)
    err = info.value
    assert isinstance(err, WorkerError) and set(err.failures) == {1}
    assert err.failures[1].pid == 101 and err.failures[1].exitcode == 1
    assert err.get_first_failure()[0] == 1 and "broken shard on rank 1" in err.failures[1].message
    assert "broken shard on rank 1" in str(err) and "last line of rank 1" in str(err)
