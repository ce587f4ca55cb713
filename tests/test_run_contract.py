"""One rank state and one run state, everywhere: the kernel's enums (kernelside/run_contract.py), what the
recorder computes, what the server sends, and the TypeScript unions the panel is compiled against.

The TypeScript side is read from ``jupyter_ext/src/types.ts`` itself, so adding a state on one side
only fails here until the other side has it too.
"""

from __future__ import annotations

import json
import os
import re

import pytest

from jupyter_ext.runs import RunFolders
from kernelside.engines.contract import ExitStatus
from kernelside.launch.recorder import RunRecorder
from kernelside.launch.report import LaunchReport
from kernelside.run_contract import (
    FINAL_RANK_STATES,
    FORMAT_VERSION,
    LIVE_RUN_STATES,
    STATE_FILE,
    WRITTEN_RUN_STATES,
    RankState,
    RunState,
)

TYPES_TS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "jupyter_ext", "src", "types.ts")


def typescript_union(name: str) -> list[str]:
    """The string literals of ``export type NAME = 'a' | 'b' ...;`` in types.ts, in their order."""
    with open(TYPES_TS) as fh:
        source = fh.read()
    match = re.search(rf"export type {name}\s*=([^;]*);", source)
    assert match, f"types.ts has no `export type {name} = ...;`"
    body = re.sub(r"//[^\n]*|/\*.*?\*/", "", match.group(1), flags=re.S)
    words = re.findall(r"'([^']*)'|\"([^\"]*)\"", body)
    return [a or b for a, b in words]


def test_the_typescript_rank_states_are_the_kernels_enum():
    assert typescript_union("RankState") == [s.value for s in RankState]


def test_the_typescript_run_states_are_the_kernels_enum_idle_included():
    assert typescript_union("RunState") == [s.value for s in RunState]
    assert "idle" in typescript_union("RunState")  # a live session between cells


def test_the_union_parser_reads_what_prettier_writes_on_one_line_or_many(tmp_path, monkeypatch):
    ts = tmp_path / "types.ts"
    ts.write_text("export type A =\n  | 'x' // first\n  | 'y';\nexport type B = 'p' | \"q\";\n")
    monkeypatch.setattr(f"{__name__}.TYPES_TS", str(ts))
    assert typescript_union("A") == ["x", "y"] and typescript_union("B") == ["p", "q"]


# -- what the server sends ----------------------------------------------------------------------


def _forge(base, name: str, state: dict) -> None:
    folder = base / name
    folder.mkdir(mode=0o700, parents=True)
    (folder / STATE_FILE).write_text(json.dumps({"version": FORMAT_VERSION, **state}))


@pytest.fixture
def server_side(tmp_path):
    """A RunFolders over a root whose nblaunch.yaml puts run folders in ``root/runs``."""
    root = tmp_path / "root"
    (root / "runs").mkdir(parents=True, mode=0o700)
    (root / "nblaunch.yaml").write_text("log_dir: runs\n")
    return RunFolders(root), root / "runs"


def test_the_server_sends_every_run_state_and_nothing_else(server_side):
    folders, base = server_side
    forged = {}
    for i, state in enumerate([*WRITTEN_RUN_STATES, "no such state"]):
        forged[f"run-20200101-0000{i:02d}-contract{i}"] = state
        _forge(base, f"run-20200101-0000{i:02d}-contract{i}", {"state": state, "started": 1e9 + i})
    sent = {r["id"]: r["state"] for r in folders.list_runs() if r["id"] in forged}  # (not this user's other runs)
    assert len(sent) == len(forged)
    # no kernel holds these folders: a state that says "live" means its kernel died (lost)
    expected = {s for s in WRITTEN_RUN_STATES if s not in LIVE_RUN_STATES} | {RunState.LOST, RunState.UNKNOWN}
    assert set(sent.values()) == expected
    assert set(sent.values()) <= set(typescript_union("RunState"))


def test_the_server_passes_each_ranks_state_as_the_kernel_wrote_it(server_side):
    folders, base = server_side
    ranks = [{"rank": i, "pid": None, "state": s.value} for i, s in enumerate(RankState)]
    _forge(base, "run-20200101-000000-ranks", {"state": "done", "ranks": ranks})
    detail = folders.run("run-20200101-000000-ranks")
    assert [r["state"] for r in detail["ranks"]] == typescript_union("RankState")


# -- what the recorder computes (the transitions of RankState's docstring) ----------------------


def _recorder(n=3, **kwargs) -> RunRecorder:
    report = LaunchReport(world_size=n, backend="gloo", start_method="fork", port=0, log_dir="/logs", started_at=0.0)
    return RunRecorder(report, stop=lambda: None, **kwargs)


def _states(rec: RunRecorder) -> list[RankState]:
    return [r.state for r in rec.report.ranks]


def _error(rank: int) -> dict:
    return {"type": "ValueError", "message": f"bad batch on rank {rank}", "traceback": "", "phase": "run", "t": 1.0}


def test_one_shot_ranks_go_starting_running_then_done_failed_or_stopped():
    rec = _recorder()
    rec.add_ranks([(0, 100), (1, 101), (2, 102)])
    assert _states(rec) == [RankState.STARTING] * 3
    for rank in range(3):
        rec.event(rank, "ready", {"pid": 100 + rank, "t": 0.5})
    assert _states(rec) == [RankState.RUNNING] * 3
    rec.event(2, "done", {"t": 0.9})
    rec.exited(2, ExitStatus(0, None))
    rec.event(1, "error", _error(1))  # the first failure: the others are stopped
    rec.exited(0, ExitStatus(None, 15))  # our SIGTERM
    assert _states(rec) == [RankState.STOPPED, RankState.FAILED, RankState.DONE]
    rec.exited(1, ExitStatus(1, None))
    rec.close()
    assert _states(rec) == [RankState.STOPPED, RankState.FAILED, RankState.DONE]
    assert all(s.is_final for s in _states(rec))


def test_a_done_rank_whose_process_then_fails_is_failed_and_final_states_stay():
    rec = _recorder(n=2)
    rec.add_ranks([(0, 100), (1, 101)])
    rec.event(1, "done", {"t": 0.9})
    rec.exited(1, ExitStatus(None, 11))  # SIGSEGV after its code returned
    assert rec.report.ranks[1].state is RankState.FAILED
    rec.event(1, "ready", {"pid": 101, "t": 1.0})  # nothing moves a final state back
    assert rec.report.ranks[1].state is RankState.FAILED


def test_ranks_still_running_when_the_run_closes_were_stopped():
    rec = _recorder(n=2)
    rec.add_ranks([(0, 100), (1, 101)])
    rec.event(0, "ready", {"pid": 100, "t": 0.5})
    rec.interrupted()  # ■ on a one-shot cell: the engine stops every rank, then the recorder closes
    rec.close()
    assert _states(rec) == [RankState.STOPPED, RankState.STOPPED]


def test_live_ranks_go_busy_then_back_to_idle_whatever_the_outcome_and_dead_when_gone():
    start = _recorder(n=2)
    start.add_ranks([(0, 100), (1, 101)], request=0)
    assert _states(start) == [RankState.STARTING] * 2
    start.event(0, "ready", {"pid": 100, "t": 0.1})
    start.event(0, "idle", {"cell": 0, "t": 0.2})
    assert _states(start) == [RankState.IDLE, RankState.STARTING]

    cell = _recorder(n=2)
    cell.add_ranks([(0, 100), (1, 101)], request=3)
    assert _states(cell) == [RankState.BUSY] * 2
    cell.event(0, "done", {"t": 0.9})  # its code returned: busy until it is back
    cell.event(1, "error", _error(1))  # the cell failed on rank 1: it keeps its state and comes back
    cell.event(1, "idle", {"cell": 2, "t": 1.0})  # a late idle of an earlier request changes nothing
    assert _states(cell) == [RankState.BUSY] * 2
    cell.event(1, "idle", {"cell": 3, "t": 1.1})
    cell.exited(0, ExitStatus(None, 9))
    cell.close()
    assert _states(cell) == [RankState.DEAD, RankState.IDLE]
    assert FINAL_RANK_STATES >= {RankState.DEAD} and not RankState.IDLE.is_final
