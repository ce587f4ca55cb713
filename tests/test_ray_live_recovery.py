"""Live ranks on a real multi-node Ray cluster through what goes wrong there: ``--timeout`` and mismatched
collectives (every rank back to idle, its state kept, the same actors), a rank's process SIGKILLed and a node
removed, each during a cell and between cells (named by rank and node within seconds, the ranks that stayed
keep their state, a new actor in each freed bundle of the same placement group).

One cluster start for the whole module: ray_recovery_driver.py runs every step on one
``ray.cluster_utils.Cluster`` (a head without CPUs, three worker nodes of 2 CPUs each, a fourth added later)
and prints what each step showed.
"""

from __future__ import annotations

import ast
import json
import os
import sys

import pytest
from kernel import REPO
from netns import run_isolated

pytestmark = [pytest.mark.kernel, pytest.mark.processes]

STATE_KEPT_S = 30  # a stopped cell, every rank back: generous, the machine is loaded
NAMED_S = 10  # a lost rank named in the cell, from the kill (or the removal) on


@pytest.fixture(scope="module")
def shown(starts_kernels):
    driver = [sys.executable, os.path.join(REPO, "tests", "ray_recovery_driver.py")]
    proc = run_isolated(driver, timeout=580, env={"PYTHONPATH": REPO})
    assert proc.returncode == 0, proc.stderr[-6000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "crash" not in out, (out["crash"], {k: v for k, v in out.items() if k != "crash"})
    return out


def _kept(out: dict, key: str) -> list:
    """Each rank's (mark, model checksum) after a step, as the kernel printed them."""
    cell = out[f"{key}_kept"]
    assert cell["error"] is None, cell
    return ast.literal_eval(cell["kept"])


def _text(cell: dict) -> str:
    return cell["stdout"] + cell["stderr"] + (" ".join(cell["error"]) if cell["error"] else "")


def _pids(ranks: list[dict]) -> list[int]:
    return [r["pid"] for r in ranks]


def _state_kept_and_collectives_work(out: dict, key: str, replaced=()) -> None:
    """The ranks that stayed hold what they held before; the replaced ones nothing; a collective over all works."""
    before = ast.literal_eval(out["kept_before"]["kept"])
    now = _kept(out, key)
    for rank, (was, has) in enumerate(zip(before, now, strict=True)):
        assert has == ((None, None) if rank in replaced else was), (rank, was, has)
    assert out[f"{key}_total"]["error"] is None, out[f"{key}_total"]
    assert out[f"{key}_total"]["total"] == "28.0\n"  # 7 on each of 4 ranks (sent again to a replacement)


def test_timeout_brings_every_ray_rank_back_idle_with_its_state_in_the_same_actors(shown):
    cell = shown["timeout"]
    assert cell["error"][0] == "LaunchTimeoutError", cell
    text = _text(cell)
    assert "rank 0: cell " in text and "waiting in torch.distributed.barrier()" in text
    assert "every rank kept its state" in text and "restarted" not in text
    assert cell["s"] < 2 + STATE_KEPT_S
    before = ast.literal_eval(shown["kept_before"]["kept"])
    assert [m for m, _ in before] == [100, 101, 102, 103] and len({c for _, c in before}) == 1  # DDP: in sync
    _state_kept_and_collectives_work(shown, "after_timeout")
    assert _pids(shown["after_timeout_ranks"]) == _pids(shown["ranks"])  # the same actors' processes


def test_mismatched_collectives_on_ray_are_named_at_once_and_every_rank_keeps_its_state(shown):
    cell = shown["mismatch"]
    text = _text(cell)
    assert "the ranks called different collectives, which can never complete" in text, text
    assert "waiting in torch.distributed.barrier() (collective #" in text
    assert "waiting in torch.distributed.all_reduce() (collective #" in text
    assert "restarted" not in text and cell["s"] < STATE_KEPT_S
    _state_kept_and_collectives_work(shown, "after_mismatch")
    assert _pids(shown["after_mismatch_ranks"]) == _pids(shown["ranks"])


def test_a_rank_killed_during_a_cell_is_named_with_its_node_and_replaced_in_its_bundle(shown):
    cell, start = shown["kill_during"], shown["ranks"]
    text = _text(cell)
    assert cell["error"][0] == "WorkerError", cell
    node = start[2]["node"]
    assert f"rank 2 (pid {start[2]['pid']}) was lost on node {node}: the process ended" in text, text
    assert "the node is still up" in text and "a new actor takes each lost rank's place" in text
    assert "restarted" not in text
    assert cell["named_s"] is not None and cell["named_s"] < NAMED_S, cell
    after = shown["after_kill_during_ranks"]
    assert f"rank 2 is back as a new process (pid {after[2]['pid']}) on node {node}" in text  # the same bundle
    assert after[2]["pid"] != start[2]["pid"] and after[2]["local_rank"] == start[2]["local_rank"]
    assert [_pids(after)[r] for r in (0, 1, 3)] == [_pids(start)[r] for r in (0, 1, 3)]  # the others: same actors
    _state_kept_and_collectives_work(shown, "after_kill_during", replaced={2})


def test_a_rank_killed_between_cells_is_named_and_replaced_before_the_next_cell_runs(shown):
    assert shown["kill_between_gone"]
    cell, before = shown["kill_between"], shown["after_kill_during_ranks"]
    assert cell["error"] is None, cell  # the cell ran, on the replaced world
    assert cell["total"] == "28.0\n"
    text = _text(cell)
    assert f"rank 1 (pid {before[1]['pid']}) was lost on node {before[1]['node']}" in text, text
    assert "since the last cell" in text and "rank 1 is back as a new process" in text
    after = shown["after_kill_between_ranks"]
    assert after[1]["pid"] != before[1]["pid"] and after[1]["node"] == before[1]["node"]
    assert [_pids(after)[r] for r in (0, 2, 3)] == [_pids(before)[r] for r in (0, 2, 3)]
    _state_kept_and_collectives_work(shown, "after_kill_between", replaced={1, 2})


def test_a_node_removed_during_a_cell_names_its_ranks_and_their_bundles_go_to_another_node(shown):
    cell, before = shown["remove_during"], shown["after_kill_between_ranks"]
    node = shown["remove_during_node"]
    assert before[2]["node"] == before[3]["node"] == node
    text = _text(cell)
    assert cell["error"][0] == "WorkerError", cell
    pids = f"pids {before[2]['pid']}, {before[3]['pid']}"
    assert f"ranks 2, 3 ({pids}) were lost with node {node}, which left the Ray cluster" in text, text
    assert cell["named_s"] is not None and cell["named_s"] < NAMED_S, cell
    after = shown["after_remove_during_ranks"]
    assert after[2]["node"] == after[3]["node"] != node  # Ray placed the removed node's bundles on the spare one
    assert sorted(r["local_rank"] for r in after[2:]) == [0, 1]
    assert _pids(after)[:2] == _pids(before)[:2]
    _state_kept_and_collectives_work(shown, "after_remove_during", replaced={1, 2, 3})


def test_a_node_removed_between_cells_is_named_and_its_ranks_wait_for_a_node_with_room(shown):
    cell, before = shown["remove_between"], shown["after_remove_during_ranks"]
    node = shown["remove_between_node"]
    assert cell["error"] is None, cell
    assert cell["total"] == "28.0\n"
    text = _text(cell)
    assert f"ranks 0, 1 (pids {before[0]['pid']}, {before[1]['pid']}) were lost with node {node}" in text, text
    assert "since the last cell" in text
    after = shown["after_remove_between_ranks"]
    assert after[0]["node"] == after[1]["node"] not in (node, after[2]["node"])  # the node added after the removal
    assert _pids(after)[2:] == _pids(before)[2:]
    _state_kept_and_collectives_work(shown, "after_remove_between", replaced={0, 1, 2, 3})


def test_after_the_replacements_stop_and_the_kernels_end_leave_no_actor_placement_group_or_process(shown):
    assert shown["stop"]["error"] is None
    assert shown["stop_left"] == {"actors": 0, "placement_groups": 0, "processes": []}
    assert shown["kernel_end_left"] == {"actors": 0, "placement_groups": 0, "processes": []}
