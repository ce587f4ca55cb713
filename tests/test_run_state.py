"""The kernel side of the Runs view: every launch keeps ``state.json`` in its run folder, and
Stop over the run's control socket ends a real run like a failure does (nothing left)."""

from __future__ import annotations

import json
import os
import selectors
import socket
import stat
import threading
import time
from pathlib import Path

import psutil
import pytest
from harness import send_stop

from jupyter_ext import rank_resources, run_files
from kernelside import LaunchStoppedError, WorkerError, notebook_launcher
from kernelside.launch import run_control, run_state
from kernelside.launch.run_dir import IN_USE_FILE

pytestmark = pytest.mark.usefixtures("no_leaks")


def steps_then_return(n, pause=0.05):
    import time

    import torch.distributed as dist

    for i in range(n):
        print(f"rank {dist.get_rank()} step {i}", flush=True)
        time.sleep(pause)
    return dist.get_rank()


def rank1_raises():
    import torch.distributed as dist

    dist.barrier()
    if dist.get_rank() == 1:
        raise ValueError("bad batch 7")
    dist.barrier()


def until_stopped():
    import time

    import torch.distributed as dist

    while True:  # a collective every turn: a stop while blocked in one must work too
        dist.all_reduce(__import__("torch").ones(1))
        time.sleep(0.01)


class StateWatcher(threading.Thread):
    """Follows the (only) run folder under ``logs`` and records every state.json it reads."""

    def __init__(self, logs: Path, on_running=None):
        super().__init__(daemon=True)
        self.logs, self.on_running = logs, on_running
        self.states: list[dict] = []
        self.done = threading.Event()
        self.stop_sent_at: float | None = None
        self.reply = None

    def run_dir(self) -> Path | None:
        found = sorted(self.logs.glob("run-*")) if self.logs.exists() else []
        return found[-1] if found else None

    def run(self):
        deadline = time.monotonic() + 120
        while not self.done.is_set() and time.monotonic() < deadline:
            d = self.run_dir()
            if d is not None and (d / "state.json").exists():
                state = json.loads((d / "state.json").read_text())  # whole: it is replaced by rename
                if not self.states or state["state"] != self.states[-1]["state"]:
                    self.states.append(state)
                if state["state"] == "running" and self.on_running and self.stop_sent_at is None:
                    self.reply = self.on_running(d)
                    self.stop_sent_at = time.monotonic()
                if state["state"] not in ("starting", "running"):
                    return
            self.done.wait(0.01)


def config_with_logs(tmp_path: Path) -> tuple[Path, Path]:
    logs = tmp_path / "logs"
    cfg = tmp_path / "nblaunch.yaml"
    cfg.write_text(f"log_dir: {logs}\n")
    return cfg, logs


def test_a_launch_keeps_state_json_from_running_to_done_with_ranks_and_report(tmp_path):
    cfg, logs = config_with_logs(tmp_path)
    watcher = StateWatcher(logs)
    watcher.start()
    assert notebook_launcher(steps_then_return, args=(10,), num_processes=2, config=str(cfg)) == 0
    watcher.join(30)
    seen = [s["state"] for s in watcher.states]
    assert "running" in seen and seen[-1] == "done", seen
    running = next(s for s in watcher.states if s["state"] == "running")
    assert [r["rank"] for r in running["ranks"]] == [0, 1]
    assert all(r["state"] == "running" and r["log"] == f"rank{r['rank']}.log" for r in running["ranks"])
    # pid + start time name each rank for good: what the server checks before it samples a pid
    assert all(r["pid_start"] is not None and r["pid"] > 0 for r in running["ranks"])
    assert running["kernel_pid"] == os.getpid() and running["engine"] == "local" and running["control"] is True
    final = json.loads((watcher.run_dir() / "state.json").read_text())
    assert final["state"] == "done" and final["world_size"] == 2 and final["backend"] == "gloo"
    assert final["report"]["exit"] == ["exit code 0", "exit code 0"] and final["report"]["wall_s"] > 0
    assert [r["state"] for r in final["ranks"]] == ["done", "done"] and final["root_cause"] is None
    d = watcher.run_dir()
    assert stat.S_IMODE(d.stat().st_mode) == 0o700  # owner-only run folder
    files = [IN_USE_FILE, "rank0.log", "rank0.times", "rank1.log", "rank1.times", "state.json"]
    assert sorted(p.name for p in d.iterdir()) == sorted(files)


def test_a_failing_launch_ends_failed_with_the_root_cause_line(tmp_path):
    cfg, logs = config_with_logs(tmp_path)
    with pytest.raises(WorkerError):
        notebook_launcher(rank1_raises, num_processes=2, config=str(cfg))
    (run_dir,) = logs.glob("run-*")
    final = json.loads((run_dir / "state.json").read_text())
    assert final["state"] == "failed"
    assert final["root_cause"] == "rank 1 failed: ValueError: bad batch 7"
    assert final["ranks"][1]["state"] == "failed" and final["ranks"][1]["exit"] == "ValueError: bad batch 7"


def test_stop_over_the_control_socket_ends_a_two_rank_run_within_2s_leaving_nothing(tmp_path):
    cfg, logs = config_with_logs(tmp_path)
    watcher = StateWatcher(logs, on_running=send_stop)
    watcher.start()
    with pytest.raises(LaunchStoppedError) as info:
        # max_restarts: a stopped run is never started again
        notebook_launcher(until_stopped, num_processes=2, config=str(cfg), max_restarts=2, timeout=60)
    returned_after = time.monotonic() - watcher.stop_sent_at
    watcher.join(10)
    assert watcher.reply["ok"] is True
    assert returned_after < 2.0, f"the launch returned {returned_after:.2f}s after Stop"
    message = str(info.value)
    assert "stopped from the launch panel" in message and "nothing is left running" in message
    assert info.value.rank is None and isinstance(info.value, WorkerError)
    (run_dir,) = logs.glob("run-*")  # one run: not restarted
    final = json.loads((run_dir / "state.json").read_text())
    assert final["state"] == "stopped" and [r["state"] for r in final["ranks"]] == ["stopped", "stopped"]
    for r in final["ranks"]:
        assert not rank_resources.is_that_process(r["pid"], r["pid_start"]), f"rank {r['rank']} is still there"
    assert not (run_dir / run_control.CONTROL_SOCKET).exists()  # a later Stop finds no owner


def test_the_control_channel_answers_bad_requests_and_ping_without_stopping(tmp_path):
    stops = []
    dir_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    control = run_control.RunControl.listen(str(tmp_path))
    sel = selectors.DefaultSelector()
    control.register(sel, lambda place: stops.append(place) or True)

    def ask(raw: bytes) -> dict:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(run_control.socket_address(str(tmp_path), dir_fd))
            s.sendall(raw)
            deadline = time.monotonic() + 5
            answer = b""
            s.setblocking(False)
            while b"\n" not in answer and time.monotonic() < deadline:
                for key, _ in sel.select(0.05):  # the loop's side, as the kernel loop would run it
                    key.data[0].on_ready(key.fd)
                try:
                    answer += s.recv(4096)
                except BlockingIOError:
                    pass
            return json.loads(answer)

    try:
        assert ask(b"not json\n") == {"ok": False, "message": "the request is not a JSON object"}
        assert "unknown op 'kill'" in ask(b'{"op": "kill", "pid": 1}\n')["message"]
        assert ask(b'{"op": "ping"}\n')["ok"] is True
        assert stops == []
        assert ask(b'{"op": "stop", "from": "dashboard"}\n')["ok"] is True and stops == ["dashboard"]
        assert ask(b'{"op": "stop", "from": 7}\n')["ok"] is True and stops == ["dashboard", None]  # not a place
    finally:
        sel.close()
        control.close()
        os.close(dir_fd)
    assert not (tmp_path / run_control.CONTROL_SOCKET).exists()


def test_the_words_after_stop_name_where_it_was_pressed():
    assert "stopped from the run's dashboard (Stop)" in run_control.stopped_message("dashboard")
    assert "stopped from the launch sidebar's runs list" in run_control.stopped_message("sidebar")
    assert "stopped from the launch panel" in run_control.stopped_message(None)  # the API, naming no place
    assert "stopped from the launch panel" in run_control.stopped_message("elsewhere")


def test_a_long_run_folder_path_still_gets_a_control_socket(tmp_path):
    deep = tmp_path / ("x" * 60) / ("y" * 60)
    deep.mkdir(parents=True)
    assert len(str(deep / run_control.CONTROL_SOCKET)) > 108
    control = run_control.RunControl.listen(str(deep))
    try:
        assert stat.S_ISSOCK(os.lstat(deep / run_control.CONTROL_SOCKET).st_mode)
    finally:
        control.close()


def test_the_server_reads_the_names_and_pid_identity_the_kernel_writes():
    assert run_files.STATE_FILE == run_state.STATE_FILE
    assert run_files.CONTROL_SOCKET == run_control.CONTROL_SOCKET
    assert run_files.IN_USE_FILE == IN_USE_FILE
    me = psutil.Process()
    assert rank_resources.proc_start_time(me.pid) == run_state.proc_start_time(me.pid) is not None


def test_a_state_file_that_cannot_be_written_never_fails_the_run(tmp_path):
    run_dir = tmp_path / "run-20250101-000000-gone"
    run_dir.mkdir()
    writer = run_state.RunStateWriter(str(run_dir), engine="local")
    assert writer.update(None) is True
    for p in run_dir.iterdir():
        p.unlink()
    run_dir.rmdir()  # the folder went away under the run (a cleaner, a full disk...)
    assert writer.update(None, final=True) is False and isinstance(writer.failed, OSError)


def test_a_launch_outside_a_notebook_cell_names_no_cell_and_no_flags():
    # In a kernel the cell's execution count and %%distributed flags are written (the browser test
    # of the Runs dashboard reads them back: cell 2, "-n 2"); a script has neither.
    assert run_state.running_cell() == {"cell": None, "flags": None}
