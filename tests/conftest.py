"""Shared fixtures: every test checks that it left no worker process, fd or port behind."""

from __future__ import annotations

import os
import pathlib
import socket

import psutil
import pytest
from local_user import other_user  # noqa: F401 - the fixture (a second local user), for the tests that ask for it

GPU_TESTS = pathlib.Path(__file__).parent / "gpu"


def pytest_ignore_collect(collection_path, config):
    """tests/gpu/ needs CUDA: it runs only when named (make test-gpu), never as part of ``pytest tests``."""
    if collection_path != GPU_TESTS and GPU_TESTS not in collection_path.parents:
        return None
    base = config.invocation_params.dir
    for arg in config.args:
        named = (base / arg.split("::")[0]).resolve()
        if named == GPU_TESTS or GPU_TESTS in named.parents:
            return None
    return True


def open_fds() -> set[int]:
    return {int(fd) for fd in os.listdir("/proc/self/fd")}


def listening_ports() -> set[int]:
    return {c.laddr.port for c in psutil.Process().net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN}


def _one():
    return 1


@pytest.fixture(scope="session")
def warmed_launcher():
    """One launch first: torch's libuv keeps a process-wide signal pipe from its first TCPStore on."""
    from kernelside import notebook_launcher

    notebook_launcher(_one, num_processes=1)


@pytest.fixture
def no_leaks(warmed_launcher):
    """Fails the test if worker processes, fds or listening ports outlive the launch."""
    before_fds = open_fds()
    before_ports = listening_ports()
    yield
    me = psutil.Process()
    children = [c for c in me.children(recursive=True) if c.status() != psutil.STATUS_ZOMBIE]
    assert children == [], f"processes left behind: {[(c.pid, c.cmdline()) for c in children]}"
    leaked = open_fds() - before_fds
    # a pytest capture file or /proc listing fd may come and go; anything pointing at a pipe/socket is ours
    leaked = {fd for fd in leaked if _kind(fd) in ("pipe", "socket", "anon_inode")}
    assert not leaked, f"fds left open: {[(fd, _kind(fd)) for fd in leaked]}"
    assert listening_ports() - before_ports == set()


def _kind(fd: int) -> str:
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return "gone"
    return target.split(":")[0]


@pytest.fixture
def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port
