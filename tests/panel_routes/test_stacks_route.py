"""``POST /nblaunch/runs/{id}/stacks`` through a real Jupyter server, over a real 2-rank launch owned
by another process (``stacks_owner.py``) with rank 1 blocked in a gloo ``barrier()``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness import REPO, fetch, forge_run, state_of, wait_until

OWNER = Path(__file__).with_name("stacks_owner.py")


@pytest.fixture
def barrier_run(starts_processes, run_base, jp_root_dir):
    """A live run whose rank 1 sits in barrier() and rank 0 in wait_for_release(); released at the end."""
    env = dict(os.environ, TMPDIR=str(run_base.parent))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env.pop("NBLAUNCH_CONFIG", None)
    cwd = run_base.parent
    process = subprocess.Popen(
        [sys.executable, str(OWNER)],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        state = wait_until(lambda: (s := state_of(run_base)) and s["state"] == "running" and s, what="running")
        folder = run_base / state["id"]
        wait_until(
            lambda: (
                all("in place" in (folder / f"rank{r}.log").read_text() for r in (0, 1))
                if all((folder / f"rank{r}.log").exists() for r in (0, 1))
                else False
            ),
            what="both ranks in place",
        )
        yield state["id"], process
    finally:
        (cwd / "release").touch()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)  # the session this test started, by its id
        process.communicate(timeout=30)


async def test_stacks_name_the_barrier_rank_1_waits_in_and_rank_0s_line_within_1s(jp_fetch, barrier_run):
    run_id, process = barrier_run
    t0 = time.monotonic()
    code, answer = await fetch(jp_fetch, run_id, "stacks", method="POST")
    elapsed = time.monotonic() - t0
    assert code == 200, answer
    assert elapsed < 1.0
    r0, r1 = answer["ranks"]
    assert r0["rank"] == 0 and r0["answered"] and r1["rank"] == 1 and r1["answered"]
    assert r1["collective"] == "barrier"
    assert [f["function"] for f in r1["frames"] if f["user"]][-1] == "stuck_in_barrier"
    assert "stacks_owner.py" in r1["where"] and r1["where"].endswith("in stuck_in_barrier")
    assert r0["collective"] is None and r0["where"].endswith("in wait_for_release")
    # from the launched function on (the frame below may be os.path.exists, a library's)
    assert [f["function"] for f in r0["frames"] if f["user"]] == ["ranks", "wait_for_release"]
    assert process.poll() is None, "asking for stacks must not disturb the run"
    code, again = await fetch(jp_fetch, run_id, "stacks", method="POST")  # each request gets its own dump
    assert code == 200 and again["ranks"][1]["collective"] == "barrier"


async def test_stacks_of_a_run_that_has_ended_are_refused_with_the_reason(jp_fetch, run_base):
    forge_run(run_base, "run-20200101-000000-finished", {"state": "done", "control": True})
    code, answer = await fetch(jp_fetch, "run-20200101-000000-finished", "stacks", method="POST")
    assert code == 409 and "is not running (done): no stacks to show" in answer["message"]


async def test_stacks_of_a_run_whose_kernel_is_gone_say_so_and_signal_nothing(jp_fetch, run_base):
    d, fd = forge_run(run_base, "run-20200101-000000-nosocket", {"state": "running", "control": True}, hold_lock=True)
    try:
        (d / "rank0.stacks").write_text("nblaunch-stacks main=0x1\n")
        code, answer = await fetch(jp_fetch, "run-20200101-000000-nosocket", "stacks", method="POST")
    finally:
        os.close(fd)
    assert code == 409 and "no control socket" in answer["message"]


@pytest.mark.processes
async def test_stacks_of_an_idle_live_session_show_each_rank_waiting_for_its_next_cell(jp_fetch, run_base):
    env = dict(os.environ, TMPDIR=str(run_base.parent))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env.pop("NBLAUNCH_CONFIG", None)
    owner = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("live_owner.py"))],
        cwd=run_base.parent,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        state = wait_until(lambda: (s := state_of(run_base)) and s["state"] == "idle" and s, what="idle")
        t0 = time.monotonic()
        code, answer = await fetch(jp_fetch, state["id"], "stacks", method="POST")
        assert code == 200, answer
        assert time.monotonic() - t0 < 1.0
        assert [(r["rank"], r["answered"], r["collective"]) for r in answer["ranks"]] == [
            (0, True, None),
            (1, True, None),
        ]
        assert all(any(f["file"].endswith("live_rank.py") for f in r["frames"]) for r in answer["ranks"])
        out, _ = owner.communicate("", timeout=30)
        assert "DONE" in out and owner.returncode == 0, out
    finally:
        if owner.poll() is None:
            os.killpg(owner.pid, signal.SIGKILL)  # the session this test started, by its id
            owner.communicate(timeout=30)
