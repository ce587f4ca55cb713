"""A live session in the launch panel's Runs view: one entry for its whole life (idle between cells,
running during one), and Stop over its control socket between cells and during a cell, in a real
kernel with real ranks."""

from __future__ import annotations

import json
import queue
import re
import time
from pathlib import Path

import pytest
from harness import send_stop

from jupyter_ext.rank_resources import is_that_process
from kernelside.launch.run_control import CONTROL_SOCKET

# the kernel's own pipes, sockets and epoll/pidfd descriptors: none may outlive a session
KERNEL_FDS = (
    "import os\nprint(sorted(f for f in os.listdir('/proc/self/fd') if os.path.exists(f'/proc/self/fd/{f}') and "
    "os.readlink(f'/proc/self/fd/{f}').split(':')[0] in ('pipe', 'socket', 'anon_inode')))"
)


@pytest.fixture(scope="module")
def kernel(kernel_with):
    k = kernel_with("import time")
    yield k
    k.run("%distributed_stop")


@pytest.fixture
def logs(tmp_path) -> tuple[Path, Path]:
    cfg = tmp_path / "nblaunch.yaml"
    cfg.write_text(f"log_dir: {tmp_path / 'logs'}\n")
    return cfg, tmp_path / "logs"


def runs(logs: Path) -> list[Path]:
    return sorted(logs.glob("run-*"))


def state(run_dir: Path) -> dict:
    return json.loads((run_dir / "state.json").read_text())  # whole: it is replaced by rename


def wait_state(run_dir: Path, wanted: str, timeout: float = 30.0) -> tuple[dict, float]:
    """The first state.json that says ``wanted``, and when it was seen (monotonic)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = state(run_dir)
        if s["state"] == wanted:
            return s, time.monotonic()
        time.sleep(0.01)
    raise AssertionError(f"{run_dir.name} never said {wanted!r}; last: {s['state']}")


def start_cell_update(kernel, timeout: float) -> str:
    """The next status-line text a widget update carries on iopub, whichever request it belongs to."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            msg = kernel.kc.get_iopub_msg(timeout=max(0.05, deadline - time.monotonic()))
        except queue.Empty:
            break
        value = msg["content"].get("data", {}).get("state", {}).get("value")
        if msg["msg_type"] == "comm_msg" and isinstance(value, str) and "<b>nblaunch" in value:
            return re.sub(r"<[^>]+>", "", value)
    raise AssertionError(f"no status-line update within {timeout}s")


def error_text(cell) -> str:
    return "\n".join(cell.error["traceback"]) if cell.error else ""


def assert_all_gone(s: dict) -> None:
    assert [r["state"] for r in s["ranks"]] == ["dead", "dead"], s["ranks"]
    for r in s["ranks"]:
        assert not is_that_process(r["pid"], r["pid_start"]), f"rank {r['rank']} (pid {r['pid']}) is still there"


def test_a_live_session_is_one_entry_idle_with_two_ranks_running_during_a_cell_and_done_at_stop(kernel, logs):
    cfg, logs = logs
    kernel.run(f"%distributed_start -n 2 --config {cfg}").ok()
    (run_dir,) = runs(logs)
    s = state(run_dir)
    assert s["state"] == "idle" and s["session"] is True and s["engine"] == "local (live)" and s["control"] is True
    assert s["cells_run"] == 0 and s["world_size"] == 2 and s["kernel_pid"] == kernel.pid
    assert [(r["rank"], r["state"]) for r in s["ranks"]] == [(0, "idle"), (1, "idle")]
    first_pids = [r["pid"] for r in s["ranks"]]
    assert all(is_that_process(r["pid"], r["pid_start"]) for r in s["ranks"])  # the server's identity check holds

    seen = {}

    def on_output(kind, content):
        if "in the cell" in content.get("text", "") and not seen:
            seen.update(wait_state(run_dir, "running", timeout=5)[0])  # a cell is written as running after 0.25 s

    kernel.run("%%distributed\nprint('in the cell', flush=True)\ntime.sleep(2)", on_output=on_output).ok()
    assert seen["state"] == "running" and [r["state"] for r in seen["ranks"]] == ["busy", "busy"]
    returned = time.monotonic()
    s, seen_at = wait_state(run_dir, "idle", timeout=5)  # written by the session's thread (PENDING_WRITE_S)
    assert s["cells_run"] == 1 and s["last_cell"] == "ok"
    assert seen_at - returned < 1.0, seen_at - returned  # 0.25 s at most, plus a loaded machine's delays

    kernel.run("%distributed_restart").ok()
    s = state(run_dir)
    assert s["state"] == "idle" and s["restarts"] == 1
    assert set(r["pid"] for r in s["ranks"]).isdisjoint(first_pids)  # the new processes, at once

    kernel.run("%distributed_stop").ok()
    s = state(run_dir)
    assert s["state"] == "done" and "ended" in s
    assert_all_gone(s)
    assert runs(logs) == [run_dir]  # one entry for the whole session, restart included
    assert not (run_dir / CONTROL_SOCKET).exists()


def test_stop_between_cells_ends_the_session_within_2s_leaving_nothing_and_the_next_cell_refuses(kernel, logs):
    cfg, logs = logs
    fds_before = kernel.run(KERNEL_FDS).ok().stdout
    kernel.run(f"%distributed_start -n 2 --config {cfg}").ok()
    kernel.run("%%distributed\nkept = rank").ok()
    (run_dir,) = runs(logs)
    assert state(run_dir)["state"] == "idle"
    sent = time.monotonic()
    reply = send_stop(run_dir)  # nothing runs in the kernel's main thread now
    assert reply["ok"] is True and "stopping the live session" in reply["message"]
    s, seen_at = wait_state(run_dir, "stopped", timeout=10)
    deadline = sent + 2.0
    while any(is_that_process(r["pid"], r["pid_start"]) for r in s["ranks"]) and time.monotonic() < deadline:
        time.sleep(0.01)
    gone_after = time.monotonic() - sent
    assert seen_at - sent < 2.0 and gone_after < 2.0, (seen_at - sent, gone_after)
    assert_all_gone(s)
    assert "stopped from the launch panel" in s["root_cause"]
    assert not (run_dir / CONTROL_SOCKET).exists()
    # the start cell's status line says so at once, though no cell runs (the kernel's loop draws it)
    assert "session stopped from the launch panel; nothing is left running" in start_cell_update(kernel, timeout=10)
    assert kernel.run(KERNEL_FDS).ok().stdout == fds_before  # no pipe, socket, epoll or pidfd left in the kernel

    refused = kernel.run("%%distributed\nprint('ran on', rank)")
    text = error_text(refused)
    assert refused.error is not None and "stopped from the launch panel" in text and "This cell did not run" in text
    assert "ran on" not in refused.stdout
    after = kernel.run(f"%%distributed -n 2 --config {cfg}\nprint('one-shot on', rank)").ok()  # no session now
    assert "one-shot on 0" in after.stdout
    assert state(run_dir)["state"] == "stopped"


def test_stop_during_a_cell_stops_that_cell_like_an_interrupt_and_every_rank_keeps_its_state(kernel, logs):
    cfg, logs = logs
    kernel.run(f"%distributed_start -n 2 --config {cfg}").ok()
    kernel.run("%%distributed\nheld = rank + 7").ok()
    (run_dir,) = runs(logs)
    pids = [r["pid"] for r in state(run_dir)["ranks"]]
    sent = {}

    def on_output(kind, content):
        if "waiting" in content.get("text", "") and not sent:
            sent["t"] = time.monotonic()
            sent["reply"] = send_stop(run_dir)

    # rank 0 waits in gloo's C++ barrier for rank 1, which sleeps: the group is unblocked and rebuilt
    cell = kernel.run(
        "%%distributed\nimport torch.distributed as dist\nprint('waiting', flush=True)\n"
        "if rank == 0:\n    dist.barrier()\nelse:\n    time.sleep(60)",
        timeout=60,
        on_output=on_output,
    )
    returned_after = time.monotonic() - sent["t"]
    assert sent["reply"]["ok"] is True and "stopping the running cell" in sent["reply"]["message"]
    assert cell.error is not None and cell.error["ename"] == "LaunchStoppedError"
    text = error_text(cell)
    assert "the cell was stopped from the launch panel" in text and "every rank kept its state" in text, text
    assert "rank 0: " in text and "waiting in torch.distributed.barrier()" in text, text
    assert "live session was stopped" not in text and "restarted" not in text
    assert returned_after < 4.0, f"the cell returned {returned_after:.2f}s after Stop (loaded machine: 4 s allowed)"
    s = wait_state(run_dir, "idle", timeout=5)[0]
    assert s["last_cell"] == "stopped" and [r["pid"] for r in s["ranks"]] == pids
    after = kernel.run(
        "%%distributed --return-from all --return h\nimport torch\nt = torch.ones(1)\n"
        "dist.all_reduce(t)\nh = (held, t.item())"
    )
    assert after.ok() and kernel.run("print(h)").ok().stdout.strip() == "[(7, 2.0), (8, 2.0)]"

    # Stop again, now between cells: the session ends
    assert "stopping the live session" in send_stop(run_dir)["message"]
    s = wait_state(run_dir, "stopped", timeout=10)[0]
    assert_all_gone(s)
    assert not (run_dir / CONTROL_SOCKET).exists()
