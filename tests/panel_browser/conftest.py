"""A real ``jupyter lab`` on 127.0.0.1 and Debian's Chromium driven by Playwright, for the
panel's end-to-end test. Both are started by the fixtures and stopped by PID."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from lab_notebooks import write_notebook
from playwright.sync_api import Error as PlaywrightError

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
# As root, in a container, with no network but the package registries.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


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


@pytest.fixture
def artifacts() -> Path:
    """Where the browser test leaves screenshots and the server log (kept after the run)."""
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


@pytest.fixture
def snapshot(artifacts):
    """``snapshot(page_or_locator, "name.png")``: a screenshot for people to look at, never an assertion.

    Chromium under load can refuse a capture ("Unable to capture screenshot"); that is written beside
    it as ``name.txt`` instead of failing the test (or hiding the error of a ``finally`` block).
    """

    def take(target, name: str) -> None:
        try:
            target.screenshot(path=str(artifacts / name), timeout=15_000)
        except PlaywrightError as e:
            (artifacts / name).with_suffix(".txt").write_text(f"no screenshot: {e}\n")

    return take


@pytest.fixture
def lab_server(tmp_path, starts_kernels):
    """``jupyter lab`` serving a fresh root with ``demo.ipynb``; stopped (by PID) after the test."""
    root = tmp_path / "root"
    root.mkdir()
    write_notebook(root / "demo.ipynb", ["import os"])
    ARTIFACTS.mkdir(exist_ok=True)
    log = ARTIFACTS / "jupyter-lab.log"
    # No "get notified about Jupyter news?" toast over the screenshots.
    notification = tmp_path / "settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    notification.parent.mkdir(parents=True)
    notification.write_text(json.dumps({"fetchNews": "false"}))
    port, token = _free_port(), secrets.token_hex(16)
    env = {k: v for k, v in os.environ.items() if k not in ("NBLAUNCH_CONFIG", "JUPYTER_CONFIG_DIR")}
    (tmp_path / "tmp").mkdir()
    env.update(
        TMPDIR=str(tmp_path / "tmp"),  # the kernels' run folders: this test's alone, not the machine's
        HOME=str(tmp_path / "home"),
        HF_HOME=str(tmp_path / "hf"),
        JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
        JUPYTER_CONFIG_DIR=str(tmp_path / "jupyter-config"),
        PYTHONUNBUFFERED="1",
    )
    command = [
        sys.executable, "-m", "jupyterlab",
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
        yield LabServer(root, port, token, process, log)
    finally:
        _stop(process)


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


@pytest.fixture
def browser_page(tmp_path):
    """A Playwright page in Debian's Chromium with a fresh profile (no downloaded browser)."""
    from playwright.sync_api import sync_playwright

    assert shutil.which(CHROMIUM) or Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: run `make frontend`"
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_FLAGS,
            viewport={"width": 1280, "height": 900},
        )
        console: list[str] = []  # the page's console and uncaught errors, kept as an artifact for a failure's reader
        try:
            page = context.pages[0] if context.pages else context.new_page()
            page.on("console", lambda m: console.append(f"[{m.type}] {m.text}"))
            page.on("pageerror", lambda e: console.append(f"[pageerror] {e}"))
            yield page
        finally:
            context.close()
            ARTIFACTS.mkdir(exist_ok=True)
            (ARTIFACTS / "browser-console.log").write_text("\n".join(console) + "\n")
