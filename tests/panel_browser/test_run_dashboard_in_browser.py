"""End to end: a notebook in a real JupyterLab and Debian's Chromium starts a 2-rank launch. At the
default sidebar width the sidebar's runs list shows it with nothing cut off; its dashboard tab opens
from the list, from the palette and from the run's name in the cell's status line, shows both ranks
(pid, state, CPU and memory charts that move), their stacks and a link to the cell; a rank's log in the
dashboard's pane (rank switcher, Follow, search; a cell's log link lands there) follows the run; Stop asks
once, ends the run, and the cell and dashboard say it was stopped from the dashboard; no process of the run
is left, and the dashboard comes back after a page reload. A live session's Stop, in the dashboard and in
the sidebar's runs list, stops its cell and then ends it, the words naming where it was pressed; then
notebooks/live_ranks.ipynb runs to its last cell with Run All."""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import psutil
from lab_notebooks import write_notebook
from playwright.sync_api import expect

PANEL = "#nblaunch-panel"
REPO = Path(__file__).resolve().parents[2]
expect.set_options(timeout=60_000)

LONG_CELL = """%%distributed -n 2
import time
import torch.distributed as dist
keep = []
for step in range(3000):
    print(f"rank {dist.get_rank()} working on step {step}", flush=True)
    keep.append(bytearray(200_000))  # memory that grows: the charts move
    sum(range(200_000))  # and some CPU
    time.sleep(0.1)
"""
# Every element of the sidebar's list that must show whole at the default width (the ellipsis
# spans are allowed to cut, and must then carry their whole text in their title).
FITS = """panel => {
  const cut = [];
  for (const el of panel.querySelectorAll('.nblaunch-run-list, .nblaunch-run-open, .nblaunch-run-line,'
      + ' .nblaunch-run-state, .nblaunch-run-elapsed, .nblaunch-actions, .nblaunch-button, .nblaunch-path')) {
    if (el.scrollWidth > el.clientWidth) cut.push(el.className + ': ' + el.textContent);
  }
  for (const el of panel.querySelectorAll('.nblaunch-run .nblaunch-ellipsis')) {
    if (el.scrollWidth > el.clientWidth && el.title !== el.textContent
        && !el.title.endsWith(el.textContent)) cut.push('no title: ' + el.textContent);
  }
  return {cut, width: panel.getBoundingClientRect().width};
}"""


def _max_step(text: str, rank: int) -> int:
    steps = [int(s) for s in re.findall(rf"rank {rank} working on step (\d+)", text)]
    return max(steps) if steps else -1


def _tab(page, label: str):
    return page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text=re.compile(f"^{re.escape(label)}$"))


def test_run_dashboard_opens_from_list_palette_and_cell_link_charts_ranks_follows_logs_and_stops(
    lab_server, browser_page, snapshot, artifacts
):
    page = browser_page
    page.set_default_timeout(60_000)
    write_notebook(lab_server.root / "train.ipynb", ["%load_ext kernelside", LONG_CELL])
    try:
        page.goto(lab_server.page_url("lab/tree/train.ipynb"))
        page.locator('.jp-SideBar [data-id="nblaunch-panel"]').click()
        panel = page.locator(PANEL)
        expect(panel.locator(".nblaunch-runs-summary")).to_contain_text("No runs yet")

        page.locator(".jp-NotebookPanel .jp-Cell").first.click()  # the notebook, not the panel, is active
        page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
        page.get_by_role("menuitem", name="Run All Cells", exact=True).click()

        # the run appears by itself (the panel watches while a cell runs), live, told apart by cell and time
        run = panel.locator('.nblaunch-run[data-state="running"]')
        expect(run).to_have_count(1, timeout=150_000)
        expect(run.locator(".nblaunch-run-origin")).to_have_text("train.ipynb")
        expect(run.locator(".nblaunch-run-meta")).to_contain_text("local · 2 ranks · gloo")
        expect(run.locator(".nblaunch-run-when")).to_have_text(re.compile(r"^cell \[2\] · started \d\d:\d\d:\d\d$"))
        run_id = run.get_attribute("data-run-id")
        fit = panel.evaluate(FITS)
        assert fit["cut"] == [], fit  # at the default sidebar width
        assert fit["width"] < 300, fit
        snapshot(panel, "sidebar.png")

        # the list opens the run's dashboard tab
        run.locator(".nblaunch-run-open").click()
        dash = page.locator(f"#nblaunch-dashboard-{run_id}")
        expect(dash.locator(".nblaunch-dash-name")).to_have_text(re.compile(r"^train \d\d:\d\d:\d\d$"))
        name = dash.locator(".nblaunch-dash-name").inner_text()
        expect(_tab(page, name)).to_have_count(1)
        facts = dash.locator(".nblaunch-dash-facts")
        expect(facts).to_contain_text("train.ipynb")
        expect(facts).to_contain_text("-n 2")
        expect(facts).to_contain_text("local · 2 ranks · gloo")
        ranks = dash.locator("table.nblaunch-dash-ranks tbody tr")
        expect(ranks).to_have_count(2)
        for r in range(2):
            expect(ranks.nth(r).locator("td").nth(2)).to_have_text("running")
            expect(ranks.nth(r).locator(".nblaunch-spark-value").nth(1)).to_have_text(re.compile(r"^\d+(\.\d)? MiB$"))
        expect(ranks.nth(1).locator(".nblaunch-spark-value").first).to_have_text(re.compile(r"^\d+%$"))  # 2nd sample
        pids = [int(ranks.nth(r).locator("td").nth(1).inner_text()) for r in range(2)]
        run_dir = next((lab_server.root.parent / "tmp").glob(f"nblaunch-*/{run_id}"))
        state = json.loads((run_dir / "state.json").read_text())
        kernel_pid = state["kernel_pid"]
        assert re.fullmatch(r"[0-9a-f-]{36}", state["kernel_id"])  # from ipykernel's connection file name
        assert state["cell"] == 2 and state["flags"] == "-n 2"

        # the memory chart moves: more samples, another line, while the run goes on
        memory = ranks.nth(1).locator('.nblaunch-spark[data-figure="rss_bytes"]')
        expect(memory).to_have_attribute("data-samples", re.compile(r"^([3-9]|\d\d+)$"))
        line = memory.locator("path").get_attribute("d")
        samples = int(memory.get_attribute("data-samples"))
        expect(memory).not_to_have_attribute("data-samples", str(samples), timeout=15_000)
        assert memory.locator("path").get_attribute("d") != line
        snapshot(page, "dashboard.png")

        # Stacks, moved here from the sidebar: where each rank is now, the run goes on
        dash.get_by_role("button", name="Stacks", exact=True).click()
        stacks = dash.locator(".nblaunch-stacks-text")
        expect(stacks).to_contain_text("rank 0:")
        expect(stacks).to_contain_text("rank 1:")
        dash.get_by_role("button", name="Hide stacks").click()
        expect(stacks).to_be_hidden()

        # rank 1's output never reaches the cell: its Log button shows it in the dashboard's log pane, following
        ranks.nth(1).get_by_role("button", name="Log").click()
        log_tab = dash.locator(".nblaunch-log")
        expect(log_tab).to_have_attribute("data-rank", "1")
        log = log_tab.locator(".nblaunch-log-text")
        expect(log).to_contain_text("rank 1 working on step")
        expect(log_tab.get_by_label("Follow the newest line")).to_be_checked()
        expect(log_tab.locator(".nblaunch-log-status")).to_contain_text("following")
        seen = _max_step(log.inner_text(), 1)
        expect(log).to_contain_text(f"rank 1 working on step {seen + 5}", timeout=30_000)
        stamps = log_tab.locator(".nblaunch-log-stamp").filter(has_text=re.compile(r"^\d\d:\d\d:\d\d$"))
        expect(stamps.first).to_be_visible()  # lines that arrived while following carry their time
        # following the newest line: the pane holds whole lines, the top one not cut in half
        scrolled, cut = log.evaluate(
            "pre => { const top = pre.getBoundingClientRect().top;"
            " const first = [...pre.querySelectorAll('.nblaunch-log-line')]"
            ".find(l => l.getBoundingClientRect().bottom > top + 0.5);"
            " return [pre.scrollTop, top - first.getBoundingClientRect().top]; }"
        )
        assert scrolled > 0 and abs(cut) <= 1, f"scrolled {scrolled} px; the top line is cut by {cut:.1f} px"
        # search: only the lines that contain the text, marked, and still following
        log_tab.locator(".nblaunch-log-search").fill("step 1")
        expect(log_tab.locator(".nblaunch-log-count")).to_contain_text("contain “step 1”")
        shown = log_tab.locator(".nblaunch-log-line")
        assert all("step 1" in t for t in shown.all_inner_texts())
        expect(log_tab.locator(".nblaunch-log-line mark").first).to_have_text("step 1")
        matches = shown.count()
        expect(shown).not_to_have_count(matches, timeout=30_000)  # new matching lines keep arriving
        snapshot(page, "dashboard-log.png")
        log_tab.locator(".nblaunch-log-search").fill("")
        # the rank switcher: another rank's log in the same pane
        log_tab.locator("select.nblaunch-log-rank").select_option("0")
        expect(log_tab).to_have_attribute("data-rank", "0")
        expect(log).to_contain_text("rank 0 working on step")
        expect(log).not_to_contain_text("rank 1 working")

        # the status line's log link in the cell lands in the dashboard's pane, at that rank
        _tab(page, "train.ipynb").click()
        page.locator('a.nblaunch-log-link[data-nblaunch-rank="1"]').first.click()
        expect(dash).to_be_visible()
        expect(log_tab).to_have_attribute("data-rank", "1")
        expect(log).to_contain_text("rank 1 working on step")

        # the palette opens it too; opening it again shows the one tab rather than a second
        _tab(page, name).locator(".lm-TabBar-tabCloseIcon").click()
        expect(dash).to_have_count(0)
        page.keyboard.press("Control+Shift+C")
        page.locator(".lm-CommandPalette-input").fill("Open run dashboard")
        page.locator(".lm-CommandPalette-item", has_text="Open run dashboard…").first.click()
        dialog = page.locator(".jp-Dialog")
        expect(dialog.locator("select option").first).to_contain_text(f"{name} · cell [2] · running")
        dialog.get_by_role("button", name="Ok").click()
        expect(dash.locator(".nblaunch-dash-name")).to_have_text(name)
        run.locator(".nblaunch-run-open").click()
        expect(page.locator(".nblaunch-dashboard")).to_have_count(1)

        # Cell [2] shows that cell in its notebook (still running: no count shown yet), from another cell
        _tab(page, "train.ipynb").click()
        page.locator(".jp-NotebookPanel .jp-Cell").first.click()
        expect(page.locator(".jp-NotebookPanel .jp-Cell.jp-mod-active")).to_contain_text("%load_ext kernelside")
        _tab(page, name).click()
        dash.locator(".nblaunch-dash-cell").click()
        expect(page.locator(".jp-NotebookPanel .jp-Cell.jp-mod-active .jp-InputArea-editor")).to_contain_text(
            "%%distributed -n 2"
        )
        _tab(page, name).click()

        # one name for the run, from one clock: the cell's status line, the sidebar and the dashboard tab
        cell_link = page.locator(f'.jp-OutputArea-output a.nblaunch-run-link[data-nblaunch-run="{run_id}"]').first
        expect(cell_link).to_have_text(name)
        expect(run.locator(".nblaunch-run-when")).to_contain_text(f"started {name.split()[-1]}")
        expect(_tab(page, name)).to_have_count(1)

        # Stop, in the dashboard: it asks once, saying it stops every rank; Cancel leaves the run alone
        stop = dash.get_by_role("button", name="Stop", exact=True)
        expect(stop).to_be_visible()
        stop.click()
        dialog = page.locator(".jp-Dialog")
        expect(dialog).to_contain_text("Stop this run?")
        expect(dialog).to_contain_text("This stops both ranks of the run")
        snapshot(page, "dashboard-stop-question.png")
        dialog.get_by_role("button", name="Cancel").click()
        expect(dialog).to_have_count(0)
        expect(dash.locator(".nblaunch-run-state")).to_have_text("running")
        stop.click()
        t0 = time.monotonic()
        page.locator(".jp-Dialog").get_by_role("button", name="Stop every rank").click()
        expect(dash.locator(".nblaunch-run-state")).to_have_text("stopped", timeout=10_000)
        assert time.monotonic() - t0 < 5.0  # < 2 s to stop, then the next poll on a loaded machine
        expect(stop).to_be_hidden()
        for r in range(2):
            expect(ranks.nth(r).locator("td").nth(2)).to_have_text(re.compile(r"^stopped"))
        expect(panel.locator(f'.nblaunch-run[data-run-id="{run_id}"][data-state="stopped"]')).to_have_count(1)
        outputs = page.locator(".jp-NotebookPanel .jp-OutputArea-output")
        expect(outputs.filter(has_text="LaunchStoppedError")).to_have_count(1, timeout=30_000)
        # the words after Stop name where it was pressed, in the cell and in the dashboard
        expect(outputs.filter(has_text="stopped from the run's dashboard (Stop)")).not_to_have_count(0)
        expect(dash.locator(".nblaunch-dash-outcome")).to_contain_text("stopped from the run's dashboard")
        expect(log_tab.locator(".nblaunch-log-status")).to_contain_text("has ended")
        assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
        assert psutil.Process(kernel_pid).children(recursive=True) == []

        # the run's name in the cell's status line opens the dashboard (the one tab, activated)
        _tab(page, name).locator(".lm-TabBar-tabCloseIcon").click()
        _tab(page, "train.ipynb").click()
        saved = lambda r: "/api/workspaces" in r.url and r.request.method == "PUT"  # noqa: E731
        with page.expect_response(saved):  # the lab saved its layout with the dashboard in it
            page.locator(f'.jp-OutputArea-output a.nblaunch-run-link[data-nblaunch-run="{run_id}"]').first.click()
        expect(dash.locator(".nblaunch-dash-name")).to_have_text(name)
        expect(dash).to_be_visible()
        snapshot(page, "dashboard-stopped.png")

        # an open dashboard comes back after a page reload, with its ended run's figures
        page.reload()
        expect(dash.locator(".nblaunch-dash-name")).to_have_text(name)
        expect(dash.locator(".nblaunch-run-state")).to_have_text("stopped")
    finally:
        snapshot(page, "dashboard-last-page.png")
    # the README's pictures are refreshed from these by `make readme-images`, never by a test run


LIVE_CELLS = [
    "%load_ext kernelside",
    "%distributed_start -n 2",
    "%%distributed\nheld = rank + 7",
    "%%distributed\nimport time\nprint('waiting', flush=True)\ntime.sleep(600)",
]


def test_a_live_sessions_dashboard_stops_its_running_cell_keeping_state_then_ends_the_session(
    lab_server, browser_page, snapshot
):
    page = browser_page
    page.set_default_timeout(60_000)
    write_notebook(lab_server.root / "live.ipynb", LIVE_CELLS)
    page.goto(lab_server.page_url("lab/tree/live.ipynb"))
    page.locator('.jp-SideBar [data-id="nblaunch-panel"]').click()
    panel = page.locator(PANEL)
    page.locator(".jp-NotebookPanel .jp-Cell").first.click()
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
    outputs = page.locator(".jp-NotebookPanel .jp-OutputArea-output")
    expect(outputs.filter(has_text="waiting")).to_have_count(1, timeout=150_000)

    run = panel.locator('.nblaunch-run[data-state="running"]')  # the session, while its cell runs
    expect(run).to_have_count(1)
    run_id = run.get_attribute("data-run-id")
    run.locator(".nblaunch-run-open").click()
    dash = page.locator(f"#nblaunch-dashboard-{run_id}")
    stop = dash.locator(".nblaunch-dash-stop")
    expect(stop).to_have_text("Stop cell")
    expect(run.locator(".nblaunch-run-stop")).to_have_text("Stop cell")  # the sidebar's, in the same words
    assert "every rank comes back to idle with its state" in stop.get_attribute("title")
    ranks = dash.locator("table.nblaunch-dash-ranks tbody tr")
    pids = [int(ranks.nth(r).locator("td").nth(1).inner_text()) for r in range(2)]
    snapshot(page, "dashboard-live-running.png")

    stop.click()
    dialog = page.locator(".jp-Dialog")
    expect(dialog).to_contain_text("Stop the running cell?")
    dialog.get_by_role("button", name="Stop the cell").click()
    expect(outputs.filter(has_text="LaunchStoppedError")).to_have_count(1, timeout=30_000)
    expect(outputs.filter(has_text="the cell was stopped from the run's dashboard")).not_to_have_count(0)
    expect(outputs.filter(has_text="every rank kept its state")).not_to_have_count(0)
    expect(dash.locator(".nblaunch-run-state")).to_have_text("idle", timeout=10_000)
    expect(stop).to_have_text("End session")
    assert [int(ranks.nth(r).locator("td").nth(1).inner_text()) for r in range(2)] == pids  # the same processes
    snapshot(page, "dashboard-live-idle.png")

    # the sidebar's runs list has the same Stop: it asks the same question once, and the words name the sidebar
    row = panel.locator(f'.nblaunch-run[data-run-id="{run_id}"]')
    side_stop = row.locator(".nblaunch-run-stop")
    expect(side_stop).to_have_text("End session")
    side_stop.click()
    expect(dialog).to_contain_text("End the live session?")
    expect(dialog).to_contain_text("This stops both ranks of the session")
    snapshot(page, "sidebar-stop-question.png")
    dialog.get_by_role("button", name="Cancel").click()
    expect(dialog).to_have_count(0)
    expect(row).to_have_attribute("data-state", "idle")
    side_stop.click()
    dialog.get_by_role("button", name="End the session").click()
    expect(dash.locator(".nblaunch-run-state")).to_have_text("stopped", timeout=10_000)
    expect(stop).to_be_hidden()
    expect(side_stop).to_be_hidden()
    expect(dash.locator(".nblaunch-dash-outcome")).to_contain_text(
        "the live session was stopped from the launch sidebar's runs list (Stop)"
    )
    start_cell = page.locator(".jp-NotebookPanel .jp-Cell").nth(1)
    _tab(page, "live.ipynb").click()
    expect(start_cell).to_contain_text("session stopped from the launch sidebar's runs list; nothing is left running")
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]

    # notebooks/live_ranks.ipynb, Run All in this JupyterLab, reaches its last cell: its failing cells are
    # tagged raises-exception, and its %debug cell is one a person runs on purpose (no prompt waits)
    shutil.copy(REPO / "notebooks" / "live_ranks.ipynb", lab_server.root / "live_ranks.ipynb")
    page.goto(lab_server.page_url("lab/tree/live_ranks.ipynb") + "&reset")  # only this notebook open
    cells = page.locator(".jp-NotebookPanel .jp-Cell")
    cells.first.click()
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
    expect(cells.last).to_contain_text("live session stopped; nothing is left running", timeout=240_000)
    expect(cells.filter(has_text="training went on to step 90")).to_have_count(1)
    expect(page.locator(".jp-NotebookPanel .jp-Stdin")).to_have_count(0)  # no (Pdb) prompt waited
    page.locator('.jp-SideBar [data-id="nblaunch-panel"]').click()  # the runs list: the session has ended
    session = panel.locator(".nblaunch-run", has_text="live_ranks.ipynb")
    expect(session).to_have_count(1)
    expect(session).to_have_attribute("data-state", re.compile(r"^(done|stopped)$"))  # not counted as running
    snapshot(page, "live-ranks-run-all.png")
