"""JupyterLab's debugger on, a cell on an engine whose ranks it does not reach (Ray one-shot, Ray live, torch's
elastic launcher across two "machines"): the cell says so once, in one line, and the launch runs as with it
off; no rank stops and none tries to reach the kernel's debugger.

The driver (visual_debugger_engines_driver.py) runs real kernels in a loopback-only network namespace: a real
Ray head on 127.0.0.1 started by the kernel, and a c10d rendezvous between two kernels."""

from __future__ import annotations

import json
import os
import sys

import pytest
from kernel import REPO
from netns import run_isolated

pytestmark = pytest.mark.timeout(600)  # (one driver: three engines' start-ups, on a loaded machine)

NOTE = "nblaunch: JupyterLab's debugger does not reach ranks on "


@pytest.fixture(scope="module")
def shown(starts_kernels):
    driver = os.path.join(REPO, "tests", "visual_debugger_engines_driver.py")
    proc = run_isolated([sys.executable, driver, "29430"], timeout=600, env={"PYTHONPATH": REPO})
    assert proc.returncode == 0, proc.stderr[-6000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def said(cell: dict) -> list[str]:
    return [line for line in (cell["stdout"] + cell["stderr"]).splitlines() if line.startswith(NOTE)]


def test_a_ray_one_shot_cell_says_once_that_the_debugger_does_not_reach_its_ranks_and_runs(shown):
    ray = shown["ray"]
    assert ray["error"] is None, ray
    assert said(ray) == [NOTE + "Ray: this launch runs without it (its breakpoints stop ranks of this machine's "
                         "launches, and plain cells)."], ray  # fmt: skip
    assert shown["ray_seen"] == "[0, 10]"
    assert "runs without JupyterLab's debugger" not in ray["stderr"]  # no rank tried to connect


def test_the_ray_the_kernel_starts_comes_up_untouched_by_the_kernels_debugger(shown):
    # joined to the kernel's debugger, Ray's dashboard process waited for a client that never attaches, and Ray
    # gave it up a minute later, saying so in the cell (its log monitor waited on)
    assert "Started a local Ray instance" in shown["ray"]["stderr"]
    assert "Failed to start the dashboard" not in shown["ray"]["stderr"], shown["ray"]["stderr"]


def test_each_ray_live_cell_says_it_once_and_runs_with_the_ranks_state_kept(shown):
    assert shown["live_start"]["error"] is None, shown["live_start"]
    for cell in shown["live"]:
        assert cell["error"] is None, cell
        assert len(said(cell)) == 1 and said(cell)[0].startswith(NOTE + "Ray:"), cell
    assert shown["live_kept"] == "[7, 8]"


def test_an_elastic_cell_says_it_once_on_the_debugged_machine_and_both_machines_run(shown):
    debugged, other = shown["elastic"]
    assert debugged["error"] is None and other["error"] is None, shown["elastic"]
    assert len(said(debugged)) == 1 and said(debugged)[0].startswith(NOTE + "torch's elastic launcher"), debugged
    assert said(other) == []  # (its kernel's debugger is off)
    assert shown["elastic_seen"] == ["0", "20"]  # each machine's first rank: 0, and 2 on the second


def test_no_rank_of_those_engines_stopped_for_the_breakpoints_in_their_cells(shown):
    assert shown["stops"] == []
