"""What several test files share, in one module, so that no test file imports another: waiting until a
condition holds, asking a run to stop as the panel's Stop does, the hostile config files, a real ``jupyter
server`` process, and the route tests' requests and forged run folders.

Fixtures live in the conftest files (kernels in ``tests/conftest.py``, the route tests' run folder base in
``tests/panel_routes/conftest.py``); a kernel itself is ``tests/kernel.py``'s.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from tornado.httpclient import HTTPClientError

from kernelside.config import MAX_DEPTH, MAX_VALUES
from kernelside.launch import run_control
from kernelside.run_contract import FORMAT_VERSION

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent


# --- waiting ---------------------------------------------------------------------------------------------------------
POLL_S = 0.02


def _until(timeout: float, what: str):
    """One turn per poll until ``timeout`` seconds have passed; then the AssertionError that names ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        yield
    raise AssertionError(f"timed out waiting for {what}")


def wait_until(condition, timeout: float = 60.0, what: str = "condition"):
    """``condition()``'s first truthy value, polled every ``POLL_S``; an AssertionError naming ``what`` after
    ``timeout`` seconds."""
    for _ in _until(timeout, what):
        value = condition()
        if value:
            return value
        time.sleep(POLL_S)


async def wait_until_async(condition, timeout: float = 60.0, what: str = "condition"):
    """``wait_until`` inside a coroutine: it never blocks the event loop (a server under test answers meanwhile)."""
    for _ in _until(timeout, what):
        value = condition()
        if value:
            return value
        await asyncio.sleep(POLL_S)


# --- a run's control socket ----------------------------------------------------------------------------------------
def send_stop(run_dir: Path) -> dict:
    """Asks the run in ``run_dir`` to stop over its control socket, as the panel's Stop does; its answer."""
    dir_fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)  # pytest's folders can be too long for sun_path
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(5)
            s.connect(run_control.socket_address(str(run_dir), dir_fd))
            s.sendall(b'{"op": "stop"}\n')
            return json.loads(s.makefile().readline())
    finally:
        os.close(dir_fd)


# --- config files anyone can make odd ------------------------------------------------------------------------------
ALIAS_BOMB = "\n".join(
    ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    + [f"{n}: &{n} [" + ", ".join([f"*{p}"] * 9) + "]" for p, n in zip("abcdefgh", "bcdefghi", strict=True)]
    + ["fsdp_config: {sharding_strategy: *i}", ""]
)  # 9**9 = 387,420,489 values once expanded, in 400 bytes

HOSTILE = {  # name: (the file, fragments of the message; {path} is the file's)
    "superscript-two": ("num_processes: '²'\n", ["invalid num_processes='²' (in {path})", "an integer >= 1"]),
    "nul-in-env": (
        'env:\n  OMP_NUM_THREADS: "4\\0rm -rf"\n',
        ["invalid env={'OMP_NUM_THREADS': '4\\x00rm -rf'} (in {path})", "the value of 'OMP_NUM_THREADS' holds a NUL"],
    ),
    "deep-yaml": (
        "fsdp_config:\n" + "".join(" " * (2 * i + 2) + f"k{i}:\n" for i in range(200)) + " " * 402 + "v: 1\n",
        [f"{{path}} nests values more than {MAX_DEPTH} levels deep (at line {MAX_DEPTH + 1}, under 'fsdp_config')"],
    ),
    "deep-json": (
        "deepspeed_config: " + '{"a": ' * 40 + "1" + "}" * 40 + "\n",
        [f"{{path}} nests values more than {MAX_DEPTH} levels deep (at line 1, under 'deepspeed_config')"],
    ),
    "json-100000-deep": ("deepspeed_config: " + "[" * 100_000 + "]" * 100_000 + "\n", ["{path} ", "nest"]),
    "binary-garbage": (
        b"\x7fELF\x02\x01\x01\x00\xff\xfe\x00garbage\n",
        ["{path} is not UTF-8 text (byte 0xff at line 1"],
    ),
    "alias-bomb": (ALIAS_BOMB, [f"{{path}} holds more than {MAX_VALUES:,} values", "YAML alias (*name)"]),
    "self-alias": ("gpu_ids: &x [*x]\n", ["{path}: the alias *x (at line 1, under 'gpu_ids') stands for a value"]),
    "ten-megabytes": ("# " + "x" * (10 << 20) + "\n", ["{path} is 10,485,763 bytes; a launch config is at most"]),
    "huge-integer": ("num_processes: " + "9" * 5000 + "\n", ["{path} is not valid YAML at line 1", "5,000 digits"]),
    "not-a-mapping": ("- 1\n- 2\n", ["{path} must hold a mapping of keys to values, found list"]),
}


# --- a real jupyter server process ---------------------------------------------------------------------------------
SERVER_START_TIMEOUT_S = 120  # a loaded 2-core machine starts a Jupyter server in seconds; this is the give-up time


class JupyterServer:
    """A jupyter server subprocess with nblaunch's extension and the test probe (``server_modules_probe.py``);
    ``port`` is set once its log says it listens there."""

    def __init__(self, root: str):
        self.port, self.token = None, secrets.token_hex(16)
        env = {**os.environ, "PYTHONPATH": str(TESTS) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyter_server", "--no-browser", "--ip=127.0.0.1", "--port=0",
             "--port-retries=0", f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={root}",
             "--ServerApp.jpserver_extensions={'jupyter_ext': True, 'server_modules_probe': True}",
             "--allow-root"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=root,
            start_new_session=True,
        )  # fmt: skip
        self.log: list[str] = []
        self.running = threading.Event()  # it listens, or it has exited
        self.reader = threading.Thread(target=self._read_log, daemon=True)
        self.reader.start()

    def _read_log(self) -> None:
        for line in self.proc.stderr:  # drained to the end, so the server never blocks on its log
            self.log.append(line)
            listening = re.search(r"nblaunch-test: listening on port (\d+)", line)
            if listening:
                self.port = int(listening.group(1))
                self.running.set()
        self.running.set()  # it exited: wake the waiter, who reads the log

    def get(self, path: str):
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/{path}", headers={"Authorization": f"token {self.token}"}
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)  # the session this test started, by its id
                self.proc.wait(10)
        self.reader.join(10)
        self.proc.stderr.close()


# --- the route tests (pytest-jupyter's jp_fetch) ---------------------------------------------------------------------
async def fetch(jp_fetch, *path, method="GET", params=None, body=None):
    """Status and JSON of a request to ``/nblaunch/runs/...``; error answers are returned, not raised."""
    kwargs = {"method": method, "params": params}
    if method == "POST":
        kwargs["body"] = json.dumps(body or {})
    try:
        response = await jp_fetch("nblaunch", "runs", *path, **kwargs)
    except HTTPClientError as e:
        response = e.response
    return response.code, json.loads(response.body)


async def fetch_json(jp_fetch, *path, method="GET", body=None):
    """Status and JSON of a request to ``/nblaunch/...``; error answers are returned, not raised."""
    kwargs = {"method": method}
    if body is not None:
        kwargs["body"] = body if isinstance(body, (str, bytes)) else json.dumps(body)
    try:
        response = await jp_fetch("nblaunch", *path, **kwargs)
    except HTTPClientError as e:
        response = e.response
    return response.code, json.loads(response.body)


def state_of(base: Path) -> dict | None:
    """The first run folder's ``state.json`` under ``base``, or None while there is none (or it is half there)."""
    for d in sorted(base.glob("run-*")):
        try:
            return json.loads((d / "state.json").read_text())
        except (OSError, ValueError):
            return None
    return None


def forge_run(base: Path, name: str, state: dict | None, *, hold_lock: bool = False):
    """A run folder made by hand (in this server's format unless ``state`` says otherwise); with ``hold_lock``
    the test holds its lock, as a live kernel would."""
    d = base / name
    d.mkdir(mode=0o700)
    if state is not None:
        (d / "state.json").write_text(json.dumps({"id": name, "version": FORMAT_VERSION, **state}))
    (d / "rank0.log").write_text("".join(f"forged line {i}\n" for i in range(5)))
    fd = os.open(d / ".in-use", os.O_CREAT | os.O_RDWR, 0o644)
    if hold_lock:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return d, fd
    os.close(fd)
    return d, None


def answers(*values):
    """A stdin answerer for ``kernel.run(..., stdin=...)``: the given replies in order, as a person would type them."""
    replies = iter(values)
    return lambda prompt, password: next(replies)


def children(pid: int) -> set[int]:
    """The pids of process ``pid``'s direct children, from /proc (what a cell started and left behind)."""
    with open(f"/proc/{pid}/task/{pid}/children") as fh:
        return {int(p) for p in fh.read().split()}
