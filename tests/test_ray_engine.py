"""engine: ray — the same cell and function through Ray Train's TorchTrainer, shown in the same cell display.

The driver (ray_driver.py) runs a real kernel in a loopback-only network namespace; the kernel
starts a real Ray head on 127.0.0.1 (2 CPUs, no dashboard) and stops it with ray.shutdown().
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from kernel import REPO
from netns import run_isolated


@pytest.fixture(scope="module")
def shown(starts_kernels):
    proc = run_isolated([sys.executable, os.path.join(REPO, "tests", "ray_driver.py")], timeout=420)
    assert proc.returncode == 0, proc.stderr[-6000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_ddp_cell_on_ray_streams_rank0_draws_bars_and_returns_its_names(shown):
    ddp = shown["ddp"]
    assert ddp["error"] is None, ddp
    assert ddp["stdout"] == "rank 0 of 2 on cpu\n"  # rank 0 only, once
    assert ddp["result"] == "2"  # world_size, the cell's last expression
    assert ddp["widgets"] == 1  # the status line, bars and chart
    assert shown["check"]["stdout"] == "Net 8 ok\n"  # --return model,losses: the plain module, 8 losses
    count, events = shown["metrics"]["stdout"].split(" ", 1)
    assert count == "8" and "'progress'" in events and "'ready': 2" in events


def test_error_in_rank_1_on_ray_names_the_rank_with_its_traceback(shown):
    ename, evalue = shown["fail"]["error"]  # notebook_launcher(shard, ..., engine="ray")
    assert ename == "WorkerError"
    assert evalue.startswith("nblaunch: rank 1 failed: ValueError: broken shard on rank 1")
    assert ", in shard\nValueError: broken shard on rank 1" in evalue  # the notebook function's frame
    assert "before the error 1" in evalue  # the tail of rank 1's output
    assert "before the error 0" in shown["fail"]["stdout"]


def test_interrupt_stops_the_ray_job_and_the_next_launch_gets_the_cluster(shown):
    stopped = shown["interrupt"]
    assert stopped["error"][0] == "KeyboardInterrupt"
    assert "running 0" in stopped["stdout"]
    assert stopped["stop_s"] < 20  # Ray Train aborts the run; the cell returns
    assert shown["ddp"]["error"] is None  # the next launch got both CPUs: workers and placement group are gone
    assert shown["left"] == []  # ray.shutdown() stopped the head and its workers


@pytest.mark.processes
def test_engine_ray_without_ray_installed_says_how_to_install_it():
    code = (
        "import sys; sys.modules['ray'] = None\n"  # as if Ray were not installed
        "from kernelside import notebook_launcher\n"
        "notebook_launcher(print, num_processes=2, engine='ray')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 1
    assert "LaunchConfigError: engine='ray' needs Ray Train" in proc.stderr
    assert "pip install 'nblaunch[ray]'" in proc.stderr and "Nothing was started." in proc.stderr
