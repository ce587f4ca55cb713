"""A real ``jupyter lab`` process for the browser tests, from any environment's Python (the test venv's, or a
new venv with the built wheel): on 127.0.0.1, a fresh root, home and settings of its own, stopped by PID.

Example::

    >>> with run_lab(sys.executable, tmp_path) as lab:  # doctest: +SKIP
    ...     page.goto(lab.page_url("lab/tree/demo.ipynb"))
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

from lab_notebooks import write_notebook

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


class LabServer:
    """A ``jupyter lab`` process: its URL, token, root directory and log."""

    def __init__(self, root: Path, port: int, token: str, process: subprocess.Popen, log: Path):
        self.root, self.port, self.token, self.process, self.log = root, port, token, process, log
        self.url = f"http://127.0.0.1:{port}"

    def page_url(self, path: str) -> str:
        return f"{self.url}/{path}?token={self.token}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def run_lab(python: str, tmp_path: Path, log_name: str = "jupyter-lab.log", env: dict[str, str] | None = None):
    """``python -m jupyterlab`` (any environment's) on 127.0.0.1 serving ``tmp_path/root`` with ``demo.ipynb``, its
    home, settings and run folders under ``tmp_path``; its stderr goes to test-artifacts/``log_name``; ``env`` is
    added to its environment. Stopped by PID.
    """
    root = tmp_path / "root"
    root.mkdir()
    write_notebook(root / "demo.ipynb", ["import os"])
    ARTIFACTS.mkdir(exist_ok=True)
    log = ARTIFACTS / log_name
    # No "get notified about Jupyter news?" toast over the screenshots.
    notification = tmp_path / "settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    notification.parent.mkdir(parents=True)
    notification.write_text(json.dumps({"fetchNews": "false"}))
    port, token = _free_port(), secrets.token_hex(16)
    extra, env = env or {}, {k: v for k, v in os.environ.items() if k not in ("NBLAUNCH_CONFIG", "JUPYTER_CONFIG_DIR")}
    (tmp_path / "tmp").mkdir()
    env.update(
        TMPDIR=str(tmp_path / "tmp"),  # the kernels' run folders: this test's alone, not the machine's
        HOME=str(tmp_path / "home"),
        HF_HOME=str(tmp_path / "hf"),
        JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
        JUPYTER_CONFIG_DIR=str(tmp_path / "jupyter-config"),
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    command = [
        python, "-m", "jupyterlab",
        "--allow-root", "--no-browser", "--ip=127.0.0.1", f"--port={port}", "--port-retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        f"--LabApp.workspaces_dir={tmp_path / 'workspaces'}",
        f"--LabApp.user_settings_dir={tmp_path / 'settings'}",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--LabApp.news_url=None",
    ]  # fmt: skip
    process = subprocess.Popen(
        command, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    ready = threading.Event()

    def copy_log():
        # Drains stderr for the whole run (a full pipe would stall the server) and says when it listens.
        with open(log, "wb") as out:
            for line in process.stderr:
                out.write(line)
                out.flush()
                if b"is running at" in line or b"http://127.0.0.1" in line:
                    ready.set()
        ready.set()  # the process ended: stop waiting

    threading.Thread(target=copy_log, daemon=True).start()
    try:
        assert ready.wait(90) and process.poll() is None, f"jupyter lab did not start; see {log}"
        assert _accepts(port, process), f"jupyter lab said it runs on port {port} but takes no connection; see {log}"
        yield LabServer(root, port, token, process, log)
    finally:
        _stop(process)


def _accepts(port: int, process: subprocess.Popen, within_s: float = 30.0) -> bool:
    """The server takes a TCP connection on ``port`` (its log line is not proof enough: a browser refused by a
    server that logged its URL a moment before was seen once, in a run with a second pytest worker beside it)."""
    deadline = time.monotonic() + within_s
    while process.poll() is None:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2):
                return True
        except OSError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
    return False


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM lets the server shut its kernels down; whatever of its session remains is killed."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        process.send_signal(signal.SIGINT)  # jupyter asks for confirmation on the first one
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
    try:
        os.killpg(process.pid, signal.SIGKILL)  # the session this test started, by its id
    except ProcessLookupError:
        pass
