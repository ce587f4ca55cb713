"""Nothing a rank starts outlives the run (issue 28): real ranks start a subprocess in a new session and a
double-forked daemon; after the cell (a cell that ends well, a cell whose rank fails while its peer waits in
a collective and is stopped, a live session's %distributed_stop) none is left, each checked by pid and start
time. A process started with NBLAUNCH_KEEP=1 stays, on purpose (the test ends it)."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from kernel import Kernel

from kernelside.run_contract import proc_stat as _stat

pytestmark = pytest.mark.kernel  # starts kernels

START = """
import json, os, subprocess, sys

def start_strays(path, keep=False):
    env = {**os.environ, "NBLAUNCH_KEEP": "1"} if keep else None
    session = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True, env=env)
    r, w = os.pipe()
    if os.fork() == 0:  # a daemon: fork, setsid, fork again, the middle one leaves
        os.setsid()
        if os.fork() == 0:
            os.write(w, str(os.getpid()).encode()); os.close(w)
            os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(300)"])
        os._exit(0)
    os.close(w)
    daemon = int(os.read(r, 32)); os.close(r)
    from kernelside.run_contract import proc_stat
    with open(path, "w") as f:  # each with its start time, noted while it surely runs
        json.dump([[pid, proc_stat(pid)[1]] for pid in (session.pid, daemon)], f)
"""


def _alive(pid: int, start: int) -> bool:
    st = _stat(pid)
    return st is not None and st[1] == start and st[2] != "Z"


def _strays(paths) -> list[tuple[int, int]]:
    """(pid, start time) of every process the ranks started, as noted when each was surely running."""
    return [(pid, start) for p in paths for pid, start in json.loads(p.read_text())]


def _wait_gone(procs, timeout=10.0) -> list:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [p for p in procs if _alive(*p)]
        if not left:
            return []
        time.sleep(0.05)
    return [p for p in procs if _alive(*p)]


@pytest.fixture
def kernel(tmp_path):
    k = Kernel(cwd=str(tmp_path), env={"TMPDIR": str(tmp_path)})
    k.run("%load_ext kernelside").ok()
    k.run(START).ok()
    yield k
    k.shutdown()


def test_a_new_session_subprocess_and_a_daemon_a_rank_starts_end_with_the_cell(kernel, tmp_path):
    # noted while the cell runs (the ranks wait for the test), so the check is of these very processes
    code = (
        f"%%distributed -n 2\nimport os, time\nstart_strays({str(tmp_path)!r} + f'/strays{{rank}}')\n"
        f"while not os.path.exists({str(tmp_path / 'go')!r}): time.sleep(0.01)\n"
    )
    cell_id = kernel.kc.execute(code)
    paths = [tmp_path / f"strays{r}" for r in (0, 1)]
    deadline = time.monotonic() + 120
    while not all(p.exists() and p.stat().st_size for p in paths) and time.monotonic() < deadline:
        time.sleep(0.05)
    procs = _strays(paths)
    assert all(_alive(*p) for p in procs)
    (tmp_path / "go").touch()
    from kernel import Cell

    cell = Cell()
    cell.msg_id = cell_id
    kernel.wait(cell, timeout=120).ok()
    assert _wait_gone(procs) == [], "left running after the cell"


def test_what_a_stopped_rank_started_ends_too_when_its_peer_fails(kernel, tmp_path):
    code = (
        "%%distributed -n 2\nimport torch, torch.distributed as dist\n"
        f"start_strays({str(tmp_path)!r} + f'/strays{{rank}}')\ndist.barrier()\n"
        "if rank == 1:\n    raise ValueError('rank 1 broke')\ndist.all_reduce(torch.ones(1))\n"
    )
    cell = kernel.run(code, timeout=180)
    assert cell.error is not None and "rank 1 broke" in "\n".join(cell.error["traceback"])
    procs = _strays([tmp_path / "strays0", tmp_path / "strays1"])
    assert _wait_gone(procs) == [], "rank 0 was stopped, what it started is still running"


def test_live_ranks_strays_end_with_distributed_stop_and_nblaunch_keep_1_stays(kernel, tmp_path):
    kernel.run("%distributed_start -n 2", timeout=300).ok()
    kernel.run(f"%%distributed\nstart_strays({str(tmp_path)!r} + f'/strays{{rank}}')").ok()
    kernel.run(f"%%distributed\nstart_strays({str(tmp_path)!r} + f'/kept{{rank}}', keep=True)").ok()
    procs = _strays([tmp_path / "strays0", tmp_path / "strays1"])
    kept = _strays([tmp_path / "kept0", tmp_path / "kept1"])
    assert all(_alive(*p) for p in procs)  # a live session keeps what its cells started, as a kernel does
    kernel.run("%distributed_stop", timeout=120).ok()
    try:
        assert _wait_gone(procs) == [], "left running after %distributed_stop"
        # kept: only the session one (the daemon of a keep=True call did not get NBLAUNCH_KEEP)
        assert _alive(*kept[0]) and _alive(*kept[2])
        assert _wait_gone([kept[1], kept[3]]) == []
    finally:
        for pid, start in kept:
            if _alive(pid, start):
                os.kill(pid, signal.SIGKILL)


def test_has_children_sees_a_child_a_zombie_and_none():
    import subprocess

    from kernelside.process_tree import has_children

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # a process of its own, which starts children
        try:
            answers = [has_children(os.getpid())]
            child = subprocess.Popen(["sleep", "30"])
            answers.append(has_children(os.getpid()))
            child.kill()
            os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # ended, not reaped yet: a zombie
            answers.append(has_children(os.getpid()))
            child.wait()
            answers.append(has_children(os.getpid()))
            os.write(w, json.dumps(answers).encode())
        finally:
            os._exit(0)
    os.close(w)
    got = os.read(r, 100).decode()
    os.close(r)
    os.waitpid(pid, 0)
    assert json.loads(got) == [False, True, True, False]
