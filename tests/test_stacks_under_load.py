"""Stacks asked for at any rate never hurt a run (issue 28): 500 requests, 4 at once, through the run's control
socket as the dashboard's Stacks asks, while 4 ranks loop over a gloo ``all_reduce``. Before, each rank dumped
from a faulthandler signal handler that any of its threads could take, and ranks crashed with SIGSEGV after 9
to 1,123 answers; ``bench/stacks_soak.py`` runs 10,000 and the old way side by side."""

from __future__ import annotations

import pytest
from kernel import Kernel

from bench.stacks_soak import soak

pytestmark = pytest.mark.kernel  # starts kernels


@pytest.fixture
def kernel(tmp_path):
    k = Kernel(cwd=str(tmp_path), env={"TMPDIR": str(tmp_path)})
    yield k
    k.shutdown()


def test_500_stacks_requests_4_at_once_never_crash_a_4_rank_allreduce_loop(kernel, tmp_path):
    kernel.run("%load_ext kernelside").ok()
    got = soak(kernel, str(tmp_path), n=4, requests=500, concurrency=4, mode="route")
    assert not got["crashed"], got["error"]
    assert got["requests"] == 500 and got["refused"] == 0, got
    # every request is answered; a rank slow to take the GIL on a loaded machine may miss one 0.5 s window
    assert got["full"] + got["partial"] == 500 and got["full"] >= 450, got
    assert got["asked_rate"] > 0, "the loop stopped moving while stacks were asked for"
    assert int(got["steps"].split()[-1]) > 0


def test_asking_every_rank_directly_1ms_apart_from_4_threads_never_crashes_the_loop(kernel, tmp_path):
    """The rate at which the old signal handler crashed a rank within seconds (bench/stacks_soak.py's 'signal')."""
    kernel.run("%load_ext kernelside").ok()
    got = soak(kernel, str(tmp_path), n=4, requests=8000, concurrency=4, mode="fifo")
    assert not got["crashed"], got["error"]
    assert got["requests"] == 8000, got
    assert int(got["steps"].split()[-1]) > 0
