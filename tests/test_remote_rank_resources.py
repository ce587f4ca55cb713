"""A rank on another machine reports its own CPU and memory; the kernel writes them into the run folder and the
server shows each such rank's latest line (without a Ray cluster: a real reporter thread on one end of a socket
pair, the kernel's real reader on the other; the whole path on a Ray cluster is tests/test_ray_live.py)."""

from __future__ import annotations

import json
import os
import socket
import time

from harness import wait_until

from jupyter_ext.rank_resources import reported_figures
from jupyter_ext.run_files import RunDir
from kernelside.live.ray_resources import RankReports
from kernelside.private_dir import open_private_dir
from kernelside.run_contract import RESOURCES_FILE, RESOURCES_FRESH_S
from kernelside.worker.own_resources import OwnResources, report_own_resources


def _run_dir(tmp_path) -> str:
    path = str(tmp_path / "run-20260101-120000-remote01")
    os.close(open_private_dir(path, create=True))
    return path


def _lines(run_dir: str) -> list[dict]:
    try:
        with open(os.path.join(run_dir, RESOURCES_FILE)) as fh:
            return [json.loads(line) for line in fh.read().splitlines()]
    except FileNotFoundError:
        return []


def test_a_remote_ranks_own_reports_reach_the_run_folder_and_the_server_shows_its_latest(tmp_path):
    run_dir = _run_dir(tmp_path)
    reports = RankReports(run_dir, every=0.1)
    rank_end, kernel_end = socket.socketpair()
    try:
        report_own_resources(rank_end.detach(), gpu=False, every=0.2)
        reports.add(rank=1, pid=4321, fd=kernel_end.detach())
        wait_until(lambda: any(line.get("cpu_percent") is not None for line in _lines(run_dir)), 20, "two samples")
        line = _lines(run_dir)[-1]
        assert line["kind"] == "resources" and line["rank"] == 1 and line["pid"] == 4321
        assert line["rss_bytes"] > 1 << 20 and abs(line["wall"] - time.time()) < 10
        ranks = [
            {"rank": 0, "pid": os.getpid(), "pid_start": 123, "node": "10.0.0.1 (aa)"},  # here: the /proc path
            {"rank": 1, "pid": 4321, "pid_start": None, "node": "10.0.0.2 (bb)"},
        ]
        with RunDir.open(run_dir) as d:
            shown = reported_figures(d, ranks, time.time())
            assert set(shown) == {1} and shown[1]["rss_bytes"] > 1 << 20 and shown[1]["cpu_percent"] >= 0
            # a replacement (another pid) is not shown the lost rank's figures, nor anyone figures gone stale
            assert reported_figures(d, [{**ranks[1], "pid": 999}], time.time()) == {}
            assert reported_figures(d, ranks, time.time() + RESOURCES_FRESH_S + 5) == {}
    finally:
        reports.close()
    assert not reports._thread.is_alive()  # closed: its thread has ended (it held the kernel's end)


def test_the_file_starts_again_past_its_bound_keeping_the_latest_line(tmp_path):
    run_dir = _run_dir(tmp_path)
    reports = RankReports(run_dir, max_bytes=600, every=0.05)
    rank_end, kernel_end = socket.socketpair()
    try:
        reports.add(rank=0, pid=7, fd=kernel_end.detach())
        for i in range(12):
            rank_end.sendall(json.dumps({"cpu_percent": float(i), "rss_bytes": 1000 + i}).encode() + b"\n")
            wait_until(lambda i=i: _lines(run_dir) and _lines(run_dir)[-1]["rss_bytes"] == 1000 + i, 10, f"line {i}")
        assert os.path.getsize(os.path.join(run_dir, RESOURCES_FILE)) <= 600
        with RunDir.open(run_dir) as d:
            ranks = [{"rank": 0, "pid": 7, "pid_start": None, "node": "10.0.0.2 (bb)"}]
            assert reported_figures(d, ranks, time.time()) == {0: {"cpu_percent": 11.0, "rss_bytes": 1011}}
    finally:
        rank_end.close()
        reports.close()


def test_own_resources_count_this_processs_cpu_time_between_two_samples():
    own = OwnResources(gpu=False)
    wall, cpu = time.monotonic(), time.process_time()
    assert own.sample()["cpu_percent"] is None
    while time.process_time() < cpu + 0.3:  # 0.3 s of this process's CPU, however long the loaded machine takes
        pass
    second = own.sample()
    expected = 100 * (time.process_time() - cpu) / (time.monotonic() - wall)  # (measured around the samples)
    assert 0.5 * expected < second["cpu_percent"] < 2 * expected + 5 and second["rss_bytes"] > 1 << 20, second


def test_a_lost_ranks_connection_is_let_go_of_and_its_replacement_is_read_under_its_new_pid(tmp_path):
    run_dir = _run_dir(tmp_path)
    reports = RankReports(run_dir, every=0.05)
    old_rank, old_kernel = socket.socketpair()
    new_rank, new_kernel = socket.socketpair()
    try:
        reports.add(rank=2, pid=100, fd=old_kernel.detach())
        reports.forget(2)  # lost: the kernel closes its end, which the old rank's end then reads as the end
        old_rank.settimeout(10)
        assert old_rank.recv(1) == b""
        reports.add(rank=2, pid=200, fd=new_kernel.detach())
        new_rank.sendall(b'{"cpu_percent": 3.5, "rss_bytes": 4096}\n')
        wait_until(lambda: _lines(run_dir) and _lines(run_dir)[-1]["pid"] == 200, 10, "the new rank's line")
        assert reports.rss(2) == 4096
    finally:
        old_rank.close()
        new_rank.close()
        reports.close()
