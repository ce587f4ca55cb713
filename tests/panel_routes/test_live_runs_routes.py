"""A live session through the Runs view's REST API (a real Jupyter server): listed idle with its ranks,
and Stop between cells ends it, nothing left. The session's owner is another process (``live_owner.py``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness import REPO, fetch, state_of, wait_until, wait_until_async

from jupyter_ext.rank_resources import is_that_process

OWNER = Path(__file__).with_name("live_owner.py")


@pytest.mark.processes
async def test_a_live_session_is_listed_idle_with_two_ranks_and_stop_between_cells_ends_it(jp_fetch, run_base):
    env = dict(os.environ, TMPDIR=str(run_base.parent))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env.pop("NBLAUNCH_CONFIG", None)
    owner = subprocess.Popen(
        [sys.executable, str(OWNER)],
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
        code, runs = await fetch(jp_fetch)
        assert code == 200
        (run,) = [r for r in runs if r["id"] == state["id"]]
        assert run["state"] == "idle" and run["live"] and run["can_stop"] and run["session"] is True
        assert run["engine"] == "local (live)" and run["cells_run"] == 0
        code, detail = await fetch(jp_fetch, state["id"])
        assert code == 200 and [(r["rank"], r["state"]) for r in detail["ranks"]] == [(0, "idle"), (1, "idle")]
        assert all(r["rss_bytes"] > 0 for r in detail["ranks"])  # proven to be the session's: sampled
        sent = time.monotonic()
        code, reply = await fetch(jp_fetch, state["id"], "stop", method="POST")
        assert code == 200 and reply["stopping"] is True
        await wait_until_async(lambda: state_of(run_base)["state"] == "stopped", timeout=10, what="stopped")
        ranks = state_of(run_base)["ranks"]
        await wait_until_async(
            lambda: not any(is_that_process(r["pid"], r["pid_start"]) for r in ranks), 5, "ranks gone"
        )
        assert time.monotonic() - sent < 2.0
        code, detail = await fetch(jp_fetch, state["id"])
        assert detail["state"] == "stopped" and not detail["can_stop"]
        out, _ = owner.communicate("", timeout=30)
        assert "DONE" in out and owner.returncode == 0, out
    finally:
        if owner.poll() is None:
            os.killpg(owner.pid, signal.SIGKILL)  # the session this test started, by its id
            owner.communicate(timeout=30)
