"""A real ``jupyter lab`` on 127.0.0.1 and Debian's Chromium driven by Playwright, for the
panel's end-to-end test. Both are started by the fixtures and stopped by PID (the server: lab_process.py)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from lab_process import ARTIFACTS, run_lab
from playwright.sync_api import Error as PlaywrightError

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
    with run_lab(sys.executable, tmp_path) as server:
        yield server


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
