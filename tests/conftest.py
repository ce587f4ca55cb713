"""Shared fixtures: kernels for the tests that drive one (``kernel``, ``kernel_with``, ``new_kernel``), the two
layers of the suite, and the check that a launch left no worker process, fd or port behind.

The layers: ``make test-fast`` (``pytest -m "not processes and not server"``) runs every test that starts no other
process and no Jupyter server, in seconds; ``make test`` runs them all. Three marks say which is which:

- ``kernel``: set at collection on every test that asks for a kernel fixture, directly or through one of its own
  fixtures (``starts_kernels`` is the one a fixture asks for when it starts kernels another way: nbclient,
  papermill, a driver script, ``jupyter lab``). A test that starts a kernel without the mark fails with the reason,
  in pytest's process or in a driver script (``kernel.refuse_kernel_in_unmarked_test``).
- ``processes``: set on every ``kernel`` test and every test that asks for ``no_leaks`` (a launch) or
  ``starts_processes`` (what a fixture asks for when it starts ranks, a server or torchrun); a test that starts
  them itself carries ``@pytest.mark.processes``.
- ``server``: set on every test that asks for pytest-jupyter's server (``jp_serverapp``; ``jp_fetch`` asks for it).
"""

from __future__ import annotations

import os
import pathlib
import socket

import psutil
import pytest
from jupyter_client.provisioning.local_provisioner import LocalProvisioner
from kernel import UNMARKED_TEST_ENV, Kernel, refuse_kernel_in_unmarked_test
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


# --- the source tree is left as it was --------------------------------------------------------------------------
SOURCE_TREE = pathlib.Path(__file__).resolve().parents[1]


def _tree_status() -> dict[str, str] | None:
    """``git status`` of the source tree: path -> its status and the hash of what is there now (None outside git).
    Ignored files (build/, test-artifacts/, .venv/) are not in it: tests may write there."""
    import subprocess

    try:
        out = subprocess.run(
            ["git", "status", "--porcelain=v1", "-z", "--untracked-files=all"],
            cwd=SOURCE_TREE, capture_output=True, check=True, timeout=60,
        ).stdout.decode()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    entries = [e for e in out.split("\0") if len(e) > 3]
    paths = {e[3:]: e[:2] for e in entries}
    hashes = subprocess.run(
        ["git", "hash-object", "--stdin-paths"], cwd=SOURCE_TREE, capture_output=True, text=True, timeout=60,
        input="\n".join(p for p in paths if (SOURCE_TREE / p).is_file()),
    ).stdout.split()  # fmt: skip
    files = iter(hashes)
    return {p: f"{code} {next(files) if (SOURCE_TREE / p).is_file() else 'gone'}" for p, code in paths.items()}


def pytest_sessionstart(session):
    session.config.stash[_TREE_AT_START] = _tree_status()


def pytest_sessionfinish(session, exitstatus):
    """A test that wrote into the source tree (a tracked file changed, a file git does not ignore appeared) fails the
    run: tests write to temporary folders, build/ or test-artifacts/ only, so a fresh clone stays clean."""
    before = session.config.stash.get(_TREE_AT_START, None)
    after = _tree_status() if before is not None else None
    if before is None or after is None:
        return
    changed = sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))
    if changed:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"the tests changed the source tree (git status): {', '.join(changed)}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


_TREE_AT_START = pytest.StashKey[dict | None]()


# --- kernels ------------------------------------------------------------------------------------------------------
KERNEL_MARK, PROCESSES_MARK, SERVER_MARK = "kernel", "processes", "server"
KERNEL_FIXTURES = frozenset({"kernel_with", "new_kernel", "starts_kernels"})  # every kernel fixture asks one
PROCESS_FIXTURES = KERNEL_FIXTURES | {"warmed_launcher", "starts_processes"}  # no_leaks asks for warmed_launcher
SERVER_FIXTURES = frozenset({"jp_serverapp"})


class KernelStarter:
    """Starts kernels for one fixture's lifetime; ``shutdown_all`` ends each one it started."""

    def __init__(self):
        self.started: list[Kernel] = []

    def __call__(self, *setup: str, load_ext: bool = True, timeout: float = 120, cwd=None, env=None) -> Kernel:
        """A kernel (``cwd``: its working directory, default the repository; ``env``: added to this environment)
        that has run ``%load_ext kernelside`` in its first cell (unless ``load_ext=False``), then each ``setup``
        cell in order, each of which must succeed within ``timeout`` seconds."""
        k = Kernel(cwd=None if cwd is None else os.fspath(cwd), env=env)
        self.started.append(k)
        for code in ("%load_ext kernelside",) * load_ext + setup:
            k.run(code, timeout=timeout).ok()
        return k

    def shutdown_all(self) -> None:
        while self.started:
            self.started.pop().shutdown()


@pytest.fixture(scope="module")
def kernel_with():
    """``kernel_with(*setup, load_ext=True, timeout=120, cwd=None, env=None)``: a kernel for the whole module, shut
    down after its last test. A module's own ``kernel`` fixture is three lines::

        @pytest.fixture(scope="module")
        def kernel(kernel_with):
            return kernel_with("import time")
    """
    starter = KernelStarter()
    yield starter
    starter.shutdown_all()


@pytest.fixture(scope="module")
def kernel(kernel_with):
    """A module's kernel with nblaunch's extension loaded and nothing else (a module overrides it with its own)."""
    return kernel_with()


@pytest.fixture
def new_kernel():
    """``new_kernel(...)``, as ``kernel_with``: a kernel of this test's own, shut down when the test ends."""
    starter = KernelStarter()
    yield starter
    starter.shutdown_all()


@pytest.fixture(scope="session")
def starts_kernels():
    """Asked for by a fixture that starts kernels another way (nbclient, papermill, a driver script, ``jupyter
    lab``), so that its tests are marked ``kernel`` too."""


@pytest.fixture(scope="session")
def starts_processes():
    """Asked for by a fixture that starts other processes (ranks, a server, torchrun, a driver), so that its tests
    are marked ``processes`` and ``make test-fast`` leaves them out."""


# --- the layers --------------------------------------------------------------------------------------------------
def pytest_collection_modifyitems(config, items):
    """Marks ``kernel`` every test that asks for a kernel fixture, however indirectly (its fixture closure),
    ``processes`` every kernel test and every test that asks for ``no_leaks`` or ``starts_processes``, and ``server``
    every test that asks for pytest-jupyter's server."""
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if KERNEL_FIXTURES & fixtures:
            item.add_marker(KERNEL_MARK)
        if item.get_closest_marker(KERNEL_MARK) is not None or PROCESS_FIXTURES & fixtures:
            item.add_marker(PROCESSES_MARK)
        if SERVER_FIXTURES & fixtures:
            item.add_marker(SERVER_MARK)


_launch_kernel = LocalProvisioner.launch_kernel


async def _refuse_unmarked_kernels(self, cmd, **kwargs):
    """Every kernel started in this process (``Kernel``, nbclient, papermill) is launched through here."""
    refuse_kernel_in_unmarked_test()
    return await _launch_kernel(self, cmd, **kwargs)


LocalProvisioner.launch_kernel = _refuse_unmarked_kernels


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """While a test not marked ``kernel`` is set up, runs and is torn down, no kernel may start: not in this
    process, nor in a driver script it runs (``tests/kernel.py`` reads the same variable there)."""
    no_kernel = item.get_closest_marker(KERNEL_MARK) is None
    if no_kernel:
        os.environ[UNMARKED_TEST_ENV] = item.nodeid
    try:
        return (yield)
    finally:
        if no_kernel:
            os.environ.pop(UNMARKED_TEST_ENV, None)


# --- leaks ----------------------------------------------------------------------------------------------------------
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
