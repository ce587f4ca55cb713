"""A real ``jupyter server`` with nblaunch's extension never loads torch: not to start, not to answer
``/nblaunch/config``, ``/nblaunch/runs`` and ``/nblaunch/hardware``.

The server runs as its own process on 127.0.0.1 and a port the OS gives it (``--port=0``), with a
test-only extension (``tests/server_modules_probe.py``) that answers the server's ``sys.modules`` and
logs when the server listens; the process's ``/proc/PID/maps`` says whether libtorch was ever mapped.
The test stops the server by its pid.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import urllib.request

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))
START_TIMEOUT_S = 120  # a loaded 2-core machine starts a Jupyter server in seconds; this is the give-up time


class _Server:
    """A jupyter server subprocess; ``port`` is set once its log says it listens there."""

    def __init__(self, root: str):
        self.port, self.token = None, secrets.token_hex(16)
        env = {**os.environ, "PYTHONPATH": TESTS + os.pathsep + os.environ.get("PYTHONPATH", "")}
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


@pytest.fixture
def server(tmp_path):
    srv = _Server(str(tmp_path))
    try:
        assert srv.running.wait(START_TIMEOUT_S) and srv.port, "".join(srv.log[-30:])
        yield srv
    finally:
        srv.stop()


def test_the_server_answers_the_panels_routes_without_ever_loading_torch(server):
    assert server.get("api/status")[0] == 200
    code, config = server.get("nblaunch/config")
    assert code == 200 and "num_processes" in config["values"] and config["schema"]
    code, runs = server.get("nblaunch/runs")
    assert code == 200 and isinstance(runs, list)
    code, hardware = server.get("nblaunch/hardware")
    assert code == 200 and hardware["cpu_count"] >= 1 and isinstance(hardware["gpus"], list)
    assert hardware["torch_version"]  # read from torch's version file, not by importing torch

    _, loaded = server.get("nblaunch-test/modules")
    assert "jupyter_ext.runs" in loaded and "kernelside.run_contract" in loaded  # the extension did load
    heavy = [m for m in loaded if m.split(".")[0] in ("torch", "accelerate", "transformers")]
    assert heavy == [], f"the server imported {heavy[:10]}"
    with open(f"/proc/{server.proc.pid}/maps") as fh:
        torch_libraries = sorted({line.split()[-1] for line in fh if "libtorch" in line})
    assert torch_libraries == [], f"the server mapped {torch_libraries}"
