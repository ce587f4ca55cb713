"""nblaunch in a real Notebook 7 (the same Jupyter server as JupyterLab) and Debian's Chromium: the panel
opens under View › Left Sidebar, a 2-rank cell runs, the run's name in the cell's status line opens its
dashboard in the right side panel (Notebook 7 keeps one document per page), a rank's log opens there too
from the dashboard, and the page shows no uncaught error. Screenshots go to test-artifacts/notebook7-*.png."""

from __future__ import annotations

import re

from lab_notebooks import write_notebook
from playwright.sync_api import expect

expect.set_options(timeout=60_000)

CELL = """%%distributed -n 2
import time
import torch.distributed as dist
for step in range(600):
    print(f"rank {dist.get_rank()} step {step}", flush=True)
    time.sleep(0.1)
"""


def test_notebook7_opens_the_panel_runs_a_cell_and_shows_its_dashboard_and_log_beside_it(
    lab_server, browser_page, snapshot, artifacts
):
    page = browser_page
    page.set_default_timeout(60_000)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(f"{e}\n{e.stack}"))
    write_notebook(lab_server.root / "nb7.ipynb", ["%load_ext kernelside", CELL])
    try:
        page.goto(lab_server.page_url("notebooks/nb7.ipynb"))
        expect(page.locator(".jp-NotebookPanel .jp-Cell").first).to_be_visible()
        page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^View$")).click()
        page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Left Sidebar$")).click()  # a submenu
        page.locator(".lm-Menu-itemLabel", has_text="Show Distributed launch").click()
        panel = page.locator("#nblaunch-panel")
        expect(panel.locator(".nblaunch-path")).to_contain_text("Config file")
        expect(panel.locator(".nblaunch-version-mismatch")).to_be_hidden()  # same nblaunch on both sides
        snapshot(page, "notebook7-panel.png")

        page.locator(".jp-NotebookPanel .jp-Cell").first.click()
        page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
        page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
        link = page.locator(".jp-OutputArea-output a.nblaunch-run-link").first
        expect(link).to_be_visible(timeout=150_000)
        link.click()
        dash = page.locator(".nblaunch-dashboard")
        expect(dash).to_be_visible()
        expect(dash.locator(".nblaunch-run-state")).to_have_text("running")
        expect(dash.locator(".nblaunch-chart").first).to_be_visible()
        # the right panel is narrow: charts and the ranks table fit its width (nothing cut off, no sideways scroll)
        snapshot(page, "notebook7-dashboard.png")
        fit = dash.evaluate(
            """d => ({width: d.clientWidth, scroll: d.scrollWidth,
                cut: [...d.querySelectorAll('*')]
                    .filter(e => e.getBoundingClientRect().right > d.getBoundingClientRect().right + 1)
                    .map(e => e.className.baseVal ?? e.className)})"""
        )
        assert fit["cut"] == [] and fit["scroll"] <= fit["width"] + 1, fit

        dash.locator(".nblaunch-rank-logs").nth(1).click()  # rank 1's log, in the dashboard's pane
        log = dash.locator('.nblaunch-log[data-rank="1"]')
        expect(log.first).to_contain_text("rank 1 step", timeout=60_000)
        snapshot(page, "notebook7-log.png")
    finally:
        page.keyboard.press("Escape")
        page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Kernel$")).click()
        page.get_by_role("menuitem", name=re.compile("^Interrupt")).click()
    (artifacts / "notebook7-pageerrors.txt").write_text("\n\n".join(errors))
    ours = [e for e in errors if "labextensions/nblaunch" in e]
    assert ours == [], ours  # an uncaught error from nblaunch's extension; others' land in the file above
