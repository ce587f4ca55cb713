"""The Runs view's REST API through a real Jupyter server (pytest-jupyter's jp_fetch), over real
launches owned by another process (``run_owner.py``) and over forged run folders."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from forged_nvml import ForgedNvml
from harness import REPO, fetch, fetch_json, forge_run, state_of, wait_until, wait_until_async

from jupyter_ext.rank_resources import is_that_process, proc_start_time
from kernelside import nvml_devices
from kernelside.run_contract import log_times_record

OWNER = Path(__file__).with_name("run_owner.py")


class Owner:
    """A process that runs one real 2-rank launch, and the run folder it made."""

    def __init__(self, process: subprocess.Popen, base: Path):
        self.process, self.base = process, base
        self.run_id: str | None = None

    def output(self) -> str:
        out, _ = self.process.communicate(timeout=30)
        return out


@pytest.fixture
def owner(starts_processes, run_base, jp_root_dir):
    """A live 2-rank run (600 lines per rank, 0.1 s apart) owned by another process, as a kernel of
    this server's (Jupyter names the notebook by its full path) would own it."""
    notebook = jp_root_dir / "work" / "demo.ipynb"
    env = dict(os.environ, TMPDIR=str(run_base.parent), JPY_SESSION_NAME=str(notebook))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env.pop("NBLAUNCH_CONFIG", None)
    process = subprocess.Popen(
        [sys.executable, str(OWNER), "600", "0.1"],
        cwd=run_base.parent,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    o = Owner(process, run_base)
    try:
        state = wait_until(lambda: (s := state_of(run_base)) and s["state"] == "running" and s, what="running")
        o.run_id = state["id"]
        yield o
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)  # the session this test started, by its id
        process.communicate(timeout=30)


async def test_runs_lists_a_live_run_first_with_notebook_engine_state_and_elapsed(
    jp_fetch, jp_root_dir, run_base, owner
):
    forge_run(run_base, "run-20200101-000000-history", {"state": "done", "started": 1.0e9, "engine": "local"})
    code, runs = await fetch(jp_fetch)
    assert code == 200
    assert [r["id"] for r in runs] == [owner.run_id, "run-20200101-000000-history"]  # newest first
    live = runs[0]
    assert live["state"] == "running" and live["live"] is True and live["can_stop"] is True
    assert live["notebook"] == "work/demo.ipynb" and live["notebook_path"] == str(jp_root_dir / "work/demo.ipynb")
    assert live["engine"] == "local" and live["world_size"] == 2
    assert live["elapsed_s"] > 0 and live["root_cause"] is None
    assert runs[1]["state"] == "done" and runs[1]["live"] is False


async def test_run_detail_shows_both_ranks_with_pid_state_cpu_and_memory(jp_fetch, run_base, owner):
    code, first = await fetch(jp_fetch, owner.run_id)
    assert code == 200 and first["log_dir"] == str(run_base / owner.run_id)
    assert [r["rank"] for r in first["ranks"]] == [0, 1]
    assert all(r["state"] == "running" and r["rss_bytes"] > 10 * 2**20 for r in first["ranks"])  # torch is loaded
    await asyncio.sleep(0.3)  # CPU use is a rate: it needs two samples some time apart
    _, second = await fetch(jp_fetch, owner.run_id)
    assert all(isinstance(r["cpu_percent"], float) for r in second["ranks"])
    assert not any(k.startswith("gpu_") for r in second["ranks"] for k in r)  # no NVML here: no GPU fields


async def test_with_a_gpu_each_rank_carries_its_gpu_memory_and_utilisation_over_time(
    jp_fetch, run_base, owner, monkeypatch
):
    # NVML as a machine with two GPUs answers it: rank 0 on GPU 0 (NVML samples its processes), rank 1 on
    # GPU 1 (per-process sampling not supported there: the GPU's own utilisation stands for it)
    pid0, pid1 = (r["pid"] for r in state_of(run_base)["ranks"])  # (the server asks NVML once, at its first look)
    forged = ForgedNvml(
        {0: [(pid0, 3 * 2**30, 87), (999_999, 2**30, 5)], 1: [(pid1, 1536 * 2**20, 12)]},
        process_util={0: True},
        device_util={1: 40},
    )
    monkeypatch.setitem(nvml_devices._nvml_state, "module", forged)
    monkeypatch.setitem(nvml_devices._nvml_state, "tried", True)
    for _ in range(2):
        _, detail = await fetch(jp_fetch, owner.run_id)
    r0, r1 = detail["ranks"]
    assert (r0["gpu_index"], r0["gpu_memory_bytes"], r0["gpu_util_percent"]) == (0, 3 * 2**30, 87.0)
    assert (r1["gpu_index"], r1["gpu_memory_bytes"], r1["gpu_util_percent"]) == (1, 1536 * 2**20, 40)
    assert forged.asked == 2  # sampled on each request, not cached
    history = detail["history"]["ranks"]
    assert history["0"]["gpu_memory_bytes"][-2:] == [3 * 2**30, 3 * 2**30]  # the charts' lines over time
    assert history["1"]["gpu_util_percent"][-1] == 40
    # another user's process on the same GPU (pid 999999) is no rank of this run: never shown
    assert all(r["pid"] != 999_999 for r in detail["ranks"])


async def test_run_detail_carries_each_ranks_figures_over_time_one_entry_per_request(jp_fetch, run_base, owner):
    for _ in range(3):
        _, detail = await fetch(jp_fetch, owner.run_id)
    history = detail["history"]
    assert len(history["t"]) == 3 and history["t"] == sorted(history["t"])
    assert sorted(history["ranks"]) == ["0", "1"]
    rss = history["ranks"]["1"]["rss_bytes"]
    assert len(rss) == 3 and all(v > 10 * 2**20 for v in rss)
    cpu = history["ranks"]["1"]["cpu_percent"]
    assert cpu[0] is None and isinstance(cpu[2], float)  # a rate: none on the first sample


async def test_log_tail_returns_the_last_lines_and_offset_follows_the_run(jp_fetch, run_base, owner):
    await wait_until_async(lambda: (run_base / owner.run_id / "rank1.log").read_text().count("\n") >= 5, what="5 lines")
    code, tail = await fetch(jp_fetch, owner.run_id, "ranks", "1", "log", params={"tail": "3"})
    assert code == 200 and tail["live"] is True and tail["log"] == "rank1.log"
    lines = tail["text"].splitlines()
    assert len(lines) == 3 and all(line.startswith("rank 1 line ") for line in lines)
    assert tail["end"] == tail["size"]
    await wait_until_async(
        lambda: (run_base / owner.run_id / "rank1.log").stat().st_size > tail["end"], what="more output"
    )
    code, more = await fetch(jp_fetch, owner.run_id, "ranks", "1", "log", params={"offset": str(tail["end"])})
    assert code == 200 and more["start"] == tail["end"] and more["text"].startswith("rank 1 line ")
    last = int(lines[-1].split()[-1])
    assert more["text"].splitlines()[0] == f"rank 1 line {last + 1}"
    # every line carries when the kernel had it (the run's rank1.times), in order, within the run's life
    started = state_of(run_base)["started"]
    for chunk in (tail, more):
        times = chunk["times"]
        assert len(times) == len(chunk["text"].splitlines()) and None not in times, chunk
        assert times == sorted(times) and started <= times[0] and times[-1] <= time.time()


async def test_log_lines_take_the_time_of_the_first_record_at_or_past_their_end(jp_fetch, run_base):
    d, _ = forge_run(run_base, "run-20200101-000000-times", {"state": "done", "started": 1.0e9, "engine": "local"})
    (d / "rank0.log").write_bytes(b"a\nbb\nccc\nd")  # line ends at 2, 5, 9; "d" (no newline yet) at 10
    records = [(2, 100.0), (7, 107.0), (10, 110.0)]  # 0-2 by t=100, 3-7 by 107, 8-10 by 110
    (d / "rank0.times").write_bytes(b"".join(log_times_record(end, wall) for end, wall in records))
    code, whole = await fetch(jp_fetch, d.name, "ranks", "0", "log", params={"offset": "0"})
    assert code == 200 and whole["times"] == [100.0, 107.0, 110.0, 110.0]
    code, part = await fetch(jp_fetch, d.name, "ranks", "0", "log", params={"offset": "5"})  # "ccc\nd"
    assert part["text"] == "ccc\nd" and part["times"] == [110.0, 110.0]
    code, tail = await fetch(jp_fetch, d.name, "ranks", "0", "log", params={"tail": "2"})
    assert tail["text"] == "ccc\nd" and tail["times"] == [110.0, 110.0]
    (d / "rank0.times").unlink()  # a run from before times were kept (or another engine's): no times, no error
    code, none = await fetch(jp_fetch, d.name, "ranks", "0", "log", params={"offset": "0"})
    assert code == 200 and none["times"] == [None, None, None, None]


async def test_stop_ends_a_live_run_within_2s_and_its_owner_raises_the_panel_error(jp_fetch, run_base, owner):
    _, before = await fetch(jp_fetch, owner.run_id)
    pids = [(r["pid"], r["pid_start"]) for r in before["ranks"]]
    code, bad = await fetch(jp_fetch, owner.run_id, "stop", method="POST", body={"from": "terminal"})
    assert code == 400 and "\"from\" is 'terminal'" in bad["message"] and "'dashboard'" in bad["message"]
    code, bad = await fetch_json(jp_fetch, "runs", owner.run_id, "stop", method="POST", body='"dashboard"')
    assert code == 400 and "must be a JSON object, got str" in bad["message"]  # not a 500
    t0 = time.monotonic()
    code, answer = await fetch(jp_fetch, owner.run_id, "stop", method="POST", body={"from": "dashboard"})
    assert code == 200 and answer["stopping"] is True
    await wait_until_async(lambda: state_of(run_base)["state"] == "stopped", timeout=10, what="stopped")
    assert time.monotonic() - t0 < 2.0
    await wait_until_async(lambda: owner.process.poll() is not None, timeout=10, what="the owner to return")
    assert owner.process.returncode == 3
    # the words after Stop name where it was pressed
    assert "LaunchStoppedError: nblaunch: the run was stopped from the run's dashboard (Stop)" in owner.output()
    assert not any(is_that_process(pid, start) for pid, start in pids), "a rank outlived Stop"
    code, runs = await fetch(jp_fetch)
    assert runs[0]["state"] == "stopped" and runs[0]["can_stop"] is False


async def test_stop_on_a_run_that_has_ended_is_refused_with_the_reason(jp_fetch, run_base):
    forge_run(run_base, "run-20200101-000000-finished", {"state": "failed", "control": True})
    code, answer = await fetch(jp_fetch, "run-20200101-000000-finished", "stop", method="POST")
    assert code == 409 and "has already ended (failed): nothing to stop" in answer["message"]


@pytest.fixture
def stranger(starts_processes):
    """A process of this test's that a forged state file names as a rank and as the kernel."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    yield process
    process.kill()
    process.wait(10)


async def test_stop_never_signals_the_process_a_forged_state_file_names(jp_fetch, run_base, stranger):
    pid = stranger.pid
    forged = {
        "state": "running",
        "control": True,
        "engine": "local",
        "kernel_pid": pid,
        "ranks": [{"rank": 0, "pid": pid, "pid_start": proc_start_time(pid), "state": "running", "log": "rank0.log"}],
    }
    d, lock = forge_run(run_base, "run-20200101-000000-forged", forged, hold_lock=True)
    try:
        code, answer = await fetch(jp_fetch, d.name, "stop", method="POST")
        assert code == 409 and "no control socket" in answer["message"]
        (d / "control.sock").write_text("not a socket")
        code, answer = await fetch(jp_fetch, d.name, "stop", method="POST")
        assert code == 403 and "is not a socket" in answer["message"]
    finally:
        os.close(lock)
    assert stranger.poll() is None, "the process a forged state file named was signalled"
    code, answer = await fetch(jp_fetch, d.name, "stop", method="POST")  # lock released: no owner at all
    assert code == 409 and "has no owner any more" in answer["message"] and "nothing was signalled" in answer["message"]
    assert stranger.poll() is None


async def test_a_pid_whose_start_time_differs_from_the_recorded_one_gets_no_figures(jp_fetch, run_base, stranger):
    pid = stranger.pid
    rank = {"rank": 0, "pid": pid, "pid_start": proc_start_time(pid) + 1, "state": "running", "log": "rank0.log"}
    d, lock = forge_run(run_base, "run-20200101-000000-reused", {"state": "running", "ranks": [rank]}, hold_lock=True)
    try:
        code, run = await fetch(jp_fetch, d.name)
    finally:
        os.close(lock)
    assert code == 200 and run["live"] is True
    assert "rss_bytes" not in run["ranks"][0] and "cpu_percent" not in run["ranks"][0]


async def test_a_running_state_without_its_kernel_shows_as_lost(jp_fetch, run_base):
    forge_run(run_base, "run-20200101-000000-orphan", {"state": "running", "kernel_pid": 4242, "control": True})
    code, runs = await fetch(jp_fetch)
    assert code == 200 and runs[0]["state"] == "lost" and runs[0]["live"] is False
    assert "pid 4242" in runs[0]["root_cause"]


async def test_runs_in_the_log_dir_of_the_servers_nblaunch_yaml_are_listed(jp_fetch, jp_root_dir, run_base):
    (jp_root_dir / "nblaunch.yaml").write_text("log_dir: team-logs\n")
    (jp_root_dir / "team-logs").mkdir()
    forge_run(jp_root_dir / "team-logs", "run-20200101-000000-fromyaml", {"state": "done"})
    code, runs = await fetch(jp_fetch)
    assert code == 200 and [r["id"] for r in runs] == ["run-20200101-000000-fromyaml"]


@pytest.mark.parametrize(
    "path, status, fragment",
    [
        (("..",), 400, "is not a run id"),
        (("run-20200101-000000-x..y",), 400, "is not a run id"),
        (("run-20200101-000000-nothere",), 404, "no run run-20200101-000000-nothere"),
        (("run-20200101-000000-link",), 403, "not a plain run folder"),
        (("run-20200101-000000-real", "ranks", "..", "log"), 400, "rank must be a whole number"),
        (("run-20200101-000000-real", "ranks", "-1", "log"), 400, "rank must be a whole number"),
        (("run-20200101-000000-real", "ranks", "3", "log"), 404, "rank3.log does not exist"),
        (("run-20200101-000000-real", "ranks", "1", "log"), 403, "is a symbolic link"),
        (("run-20200101-000000-link", "ranks", "0", "log"), 403, "not a plain run folder"),
    ],
)
async def test_ids_and_log_names_that_leave_the_run_folders_are_refused(jp_fetch, run_base, path, status, fragment):
    outside = run_base.parent / "outside"
    outside.mkdir()
    (outside / "state.json").write_text('{"state": "done"}')
    (outside / "rank0.log").write_text("secret\n")
    (run_base / "run-20200101-000000-link").symlink_to(outside)
    real, _ = forge_run(run_base, "run-20200101-000000-real", {"state": "done"})
    (real / "rank1.log").symlink_to(outside / "rank0.log")
    code, answer = await fetch(jp_fetch, *path)
    assert code == status and fragment in answer["message"]
    assert "secret" not in json.dumps(answer)
    if path == ("..",):  # the listing skips the symlinked folder too
        _, runs = await fetch(jp_fetch)
        assert [r["id"] for r in runs] == ["run-20200101-000000-real"]


async def test_a_decoded_absolute_path_as_run_id_is_refused(http_server_client, jp_base_url, jp_auth_header, run_base):
    response = await http_server_client.fetch(
        f"{jp_base_url}nblaunch/runs/%2Fetc%2Fpasswd", headers=jp_auth_header, raise_error=False
    )
    assert response.code == 400 and "'/etc/passwd' is not a run id" in json.loads(response.body)["message"]


@pytest.mark.parametrize("params", [{"tail": "many"}, {"offset": "-5"}, {"tail": "1.5"}])
async def test_malformed_log_queries_answer_400_with_a_message(jp_fetch, run_base, params):
    forge_run(run_base, "run-20200101-000000-real", {"state": "done"})
    code, answer = await fetch(jp_fetch, "run-20200101-000000-real", "ranks", "0", "log", params=params)
    assert code == 400 and "must be a whole number >= 0" in answer["message"]


async def test_the_server_holds_no_file_of_a_run_after_answering(jp_fetch, run_base):
    d, _ = forge_run(run_base, "run-20200101-000000-real", {"state": "done", "ranks": [{"rank": 0, "pid": 1}]})
    for path in [(), (d.name,), (d.name, "ranks", "0", "log")]:
        code, _ = await fetch(jp_fetch, *path)
        assert code == 200
    opened = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd") if _exists(fd)]
    assert not [p for p in opened if p.startswith(str(run_base))]


def _exists(fd: str) -> bool:
    try:
        os.readlink(f"/proc/self/fd/{fd}")
        return True
    except OSError:
        return False


@pytest.mark.parametrize(
    "method, path",
    [
        ("GET", "runs"),
        ("GET", "runs/run-20200101-000000-real"),
        ("GET", "runs/run-20200101-000000-real/ranks/0/log"),
        ("POST", "runs/run-20200101-000000-real/stop"),
    ],
)
async def test_every_runs_route_requires_authentication(http_server_client, jp_base_url, run_base, method, path):
    forge_run(run_base, "run-20200101-000000-real", {"state": "done"})
    body = None if method == "GET" else "{}"
    response = await http_server_client.fetch(
        f"{jp_base_url}nblaunch/{path}", method=method, body=body, raise_error=False
    )
    assert response.code == 403 and b"forged line" not in response.body
