"""End to end: a notebook in a real JupyterLab and Debian's Chromium starts a 2-rank launch; the
panel's Runs section shows it live with both ranks and their memory, a rank's log opens in a
tab and follows the run, Stop ends it, the cell shows the stopped-from-the-panel error, and no
process of the run is left."""

from __future__ import annotations

import json
import re
import time

import psutil
from playwright.sync_api import expect

PANEL = "#nblaunch-panel"
expect.set_options(timeout=60_000)

LONG_CELL = """%%distributed -n 2
import time
import torch.distributed as dist
for step in range(3000):
    print(f"rank {dist.get_rank()} working on step {step}", flush=True)
    time.sleep(0.1)
"""


def _notebook(path, cells: list[str]) -> None:
    path.write_text(
        json.dumps(
            {
                "cells": [
                    {"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {}, "outputs": []}
                    | {"source": source}
                    for i, source in enumerate(cells)
                ],
                "metadata": {
                    "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                    "language_info": {"name": "python"},
                },
                "nbformat": 4,
                "nbformat_minor": 5,
            }
        )
    )


def _max_step(text: str, rank: int) -> int:
    steps = [int(s) for s in re.findall(rf"rank {rank} working on step (\d+)", text)]
    return max(steps) if steps else -1


def _widen_sidebar(page, pixels: int) -> None:
    handle = page.locator("#jp-main-split-panel > .lm-SplitPanel-handle").first
    box = handle.bounding_box()
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.mouse.move(x, y)
    page.mouse.down()
    page.mouse.move(x + pixels, y, steps=5)
    page.mouse.up()


def test_runs_view_shows_a_live_launch_its_logs_and_stop_ends_it(lab_server, browser_page, snapshot):
    page = browser_page
    page.set_default_timeout(60_000)
    _notebook(lab_server.root / "train.ipynb", ["%load_ext kernelside", LONG_CELL])
    try:
        page.goto(lab_server.page_url("lab/tree/train.ipynb"))
        page.locator('.jp-SideBar [data-id="nblaunch-panel"]').click()
        panel = page.locator(PANEL)
        expect(panel.locator(".nblaunch-runs-summary")).to_contain_text("No runs yet")

        page.locator(".jp-NotebookPanel .jp-Cell").first.click()  # the notebook, not the panel, is active
        page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
        page.get_by_role("menuitem", name="Run All Cells", exact=True).click()

        # the run appears by itself (the panel watches while a cell runs) and is live
        run = panel.locator('.nblaunch-run[data-state="running"]')
        expect(run).to_have_count(1, timeout=150_000)
        expect(run.locator(".nblaunch-run-origin")).to_have_text("train.ipynb")
        expect(run.locator(".nblaunch-run-meta")).to_contain_text("local · 2 ranks · gloo")
        run_id = run.get_attribute("data-run-id")

        run.locator(".nblaunch-run-toggle").click()
        ranks = run.locator("table.nblaunch-ranks tbody tr")
        expect(ranks).to_have_count(2)
        for r in range(2):
            expect(ranks.nth(r).locator("td").nth(2)).to_have_text("running")
            expect(ranks.nth(r).locator("td").nth(4)).to_have_text(re.compile(r"^\d+(\.\d)? MiB$"))  # RSS
        expect(ranks.nth(1).locator("td").nth(3)).to_have_text(re.compile(r"^\d+(\.\d)?%$"))  # CPU, 2nd sample
        pids = [int(ranks.nth(r).locator("td").nth(1).inner_text()) for r in range(2)]
        run_dir = next((lab_server.root.parent / "tmp").glob(f"nblaunch-*/{run_id}"))
        state = json.loads((run_dir / "state.json").read_text())
        kernel_pid = state["kernel_pid"]
        assert re.fullmatch(r"[0-9a-f-]{36}", state["kernel_id"])  # from ipykernel's connection file name

        # rank 1's output never reaches the cell: its log tab shows it, and follows the run
        ranks.nth(1).get_by_role("button", name="Logs").click()
        log = page.locator(f"#nblaunch-log-{run_id}-1 .nblaunch-log-text")
        expect(log).to_contain_text("rank 1 working on step")
        expect(page.locator(f"#nblaunch-log-{run_id}-1 .nblaunch-log-status")).to_contain_text("following")
        seen = _max_step(log.inner_text(), 1)
        expect(log).to_contain_text(f"rank 1 working on step {seen + 5}", timeout=30_000)
        _widen_sidebar(page, 170)  # room for the ranks table in the screenshot
        snapshot(page, "panel-runs.png")

        # the log link in the cell's status line opens rank 0's log
        page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text="train.ipynb").click()
        page.locator('a.nblaunch-log-link[data-nblaunch-rank="0"]').first.click()
        expect(page.locator(f"#nblaunch-log-{run_id}-0 .nblaunch-log-text")).to_contain_text("rank 0 working")

        expect(run.get_by_role("button", name="Stop", exact=True)).to_be_visible()
        t0 = time.monotonic()
        run.get_by_role("button", name="Stop", exact=True).click()
        stopped = panel.locator(f'.nblaunch-run[data-run-id="{run_id}"][data-state="stopped"]')
        expect(stopped).to_have_count(1, timeout=10_000)
        assert time.monotonic() - t0 < 5.0  # < 2 s to stop, then the panel's next poll on a loaded machine
        outputs = page.locator(".jp-NotebookPanel .jp-OutputArea-output")
        expect(outputs.filter(has_text="LaunchStoppedError")).to_have_count(1, timeout=30_000)
        expect(outputs.filter(has_text="stopped from the launch panel")).not_to_have_count(0)
        page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text="train.ipynb").click()
        outputs.filter(has_text="LaunchStoppedError").scroll_into_view_if_needed()
        snapshot(page, "panel-runs-stopped-cell.png")
        expect(stopped.get_by_role("button", name="Stop", exact=True)).to_be_hidden()
        for r in range(2):
            expect(stopped.locator("table.nblaunch-ranks tbody tr").nth(r).locator("td").nth(2)).to_have_text(
                re.compile(r"^stopped")
            )
        page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text="rank 1 log").click()
        expect(page.locator(f"#nblaunch-log-{run_id}-1 .nblaunch-log-status")).to_contain_text("has ended")

        assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
        assert psutil.Process(kernel_pid).children(recursive=True) == []
    finally:
        snapshot(page, "panel-runs-last-page.png")
