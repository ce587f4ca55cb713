"""notebook_launcher(num_nodes=2): two kernels, one rendezvous on 127.0.0.1, through torch's elastic launcher."""

from __future__ import annotations

import json
import os
import sys

import pytest
from kernel import REPO
from netns import run_isolated


@pytest.fixture(scope="module")
def multinode(starts_kernels):
    """One run of the two-kernel driver (each phase is one same call on both "machines")."""
    driver = os.path.join(REPO, "tests", "multinode_driver.py")
    proc = run_isolated([sys.executable, driver, "29400"], timeout=400, env={"PYTHONPATH": REPO})
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_two_kernels_as_two_machines_train_together_and_name_the_failing_rank(multinode):
    out = multinode
    node0, node1 = out["ok"]
    assert node0["error"] is None and node1["error"] is None, out["ok"]
    assert node0["result"] == "(6.0, 4)"  # 0+1+2+3 over 4 ranks on 2 "machines"
    assert node1["result"] == "(6.0, 4)"  # that machine's first rank (2) computed the same sum
    assert "[rank 0] hello from rank 0 of 4" in node0["stdout"] and "rank 1" not in node0["stdout"]
    assert "[rank 2] hello from rank 2 of 4" in node1["stdout"]

    fail0, fail1 = out["failed"]
    assert fail1["error"][0] == "WorkerError"
    assert fail1["error"][1].startswith("nblaunch: rank 3 failed: ValueError: bad shard on rank 3")
    assert fail0["error"][0] == "WorkerError"
    assert "a rank on another machine may have failed first" in fail0["error"][1]
    cell0, cell1 = out["cell"]  # %%distributed with num_machines: 2 in each machine's config
    assert cell0["error"] is None and cell1["error"] is None, out["cell"]
    assert cell0["stdout"] == "[rank 0] cell rank 0 of 4 sum 6.0\n" and cell0["result"] == "4"
    assert cell1["stdout"] == "[rank 2] cell rank 2 of 4 sum 6.0\n" and cell1["result"] == "4"
    assert out["left"] == [[], []]


def test_on_the_elastic_engine_bars_and_metrics_of_every_machine_reach_machine_0s_cell(multinode):
    events0, events1 = multinode["events"]
    assert events0["error"] is None and events1["error"] is None, multinode["events"]
    # through the rendezvous store: rank 2 and 3 run on the other "machine"
    assert events0["bars"] == [f"[rank {r}] bar of rank {r}" for r in range(4)]
    assert events0["report"]["metric_ranks"] == [0, 1, 2, 3]
    assert events0["report"]["progress"] > 0
    # the other machine's cell draws its own ranks' bars as text, as before: no widgets without the events
    assert events1["bars"] == [] and events1["report"]["progress"] == 0


def test_timeout_stops_every_rank_on_the_elastic_engine_too(multinode):
    t0, t1 = multinode["timeout"]
    for node in (t0, t1):
        assert node["error"][0] == "LaunchTimeoutError", multinode["timeout"]
        assert "exceeded timeout=4s" in node["error"][1]
        assert node["report"]["outcome"] == "timeout"
    assert multinode["timeout_s"] < 60  # the ranks sleep 120 s
    assert multinode["left"] == [[], []]  # every worker of both machines is gone
