"""JupyterLab's own debugger on a %%distributed cell, in a real JupyterLab and Debian's Chromium: the debugger
switched on from the notebook's toolbar, a breakpoint set by clicking the cell's gutter, both ranks stopping
there, the sidebar's Ranks section (nblaunch's) choosing which rank the call stack and variables show,
Continue releasing the chosen rank only, and the section's Continue all the rest. Screenshots in
test-artifacts/."""

from __future__ import annotations

import re

from lab_notebooks import write_notebook
from playwright.sync_api import expect

expect.set_options(timeout=60_000)

CELL = """%%distributed -n 2
import time
x = rank * 10
y = x + 1
print(f"rank {rank} y {y}")"""


def _value(page, name: str):
    """The value the debugger's Variables panel shows for ``name`` (the local scope's tree row)."""
    name_cell = page.locator(".jp-DebuggerVariables-name", has_text=re.compile(rf"^{name}$"))
    row = page.locator("#jp-debugger-sidebar jp-tree-item", has=name_cell).first
    return row.locator(".jp-DebuggerVariables-detail").first


def test_breakpoint_in_the_gutter_stops_both_ranks_and_the_ranks_section_picks_one(lab_server, browser_page, snapshot):
    page = browser_page
    page.set_viewport_size({"width": 1280, "height": 720})
    page.set_default_timeout(60_000)
    write_notebook(lab_server.root / "debug.ipynb", ["%load_ext kernelside", CELL])
    page.goto(lab_server.page_url("lab/tree/debug.ipynb"))
    expect(page.locator("#jp-main-statusbar")).to_contain_text("Idle")
    cells = page.locator(".jp-NotebookPanel .jp-Cell")
    cells.nth(0).click()
    page.keyboard.press("Shift+Enter")
    expect(cells.nth(0).locator(".jp-InputArea-prompt", has_text="[1]")).to_have_count(1)

    page.locator(".jp-DebuggerBugButton").first.click()  # the notebook toolbar's bug icon
    sidebar = page.locator("#jp-debugger-sidebar")
    if not sidebar.is_visible():
        page.locator('.jp-SideBar [data-id="jp-debugger-sidebar"]').click()
    expect(sidebar).to_be_visible()
    ranks = sidebar.locator(".nblaunch-debugger-ranks")
    expect(ranks).to_be_hidden()  # no rank stopped: the section stays out of the way

    # a breakpoint on line 4 (y = x + 1), by the notebook's numbering, clicked in the gutter
    cell = cells.nth(1)
    line = cell.locator(".cm-line").nth(3).bounding_box()
    gutter = cell.locator("div.cm-breakpoint-gutter").bounding_box()
    page.mouse.click(gutter["x"] + gutter["width"] / 2, line["y"] + line["height"] / 2)
    breakpoint = sidebar.locator(".jp-DebuggerBreakpoint")
    expect(breakpoint).to_have_count(1)  # the panel's Breakpoints list has it
    expect(breakpoint.locator(".jp-DebuggerBreakpoint-line")).to_have_text("4")
    cell.click()
    page.keyboard.press("Control+Enter")

    expect(ranks).to_be_visible(timeout=120_000)
    status = ranks.locator(".nblaunch-debugger-ranks-status")
    expect(status).to_have_text("2 ranks stopped", timeout=60_000)
    select = ranks.locator("select.nblaunch-debugger-rank")
    expect(select.locator("option")).to_have_text(["rank 0", "rank 1"])
    frames = sidebar.locator(".jp-DebuggerCallstackFrame")
    for rank in (0, 1):
        select.select_option(label=f"rank {rank}")
        expect(frames.first).to_contain_text(":4", timeout=30_000)  # the cell's line 4, where it stopped
        expect(_value(page, "rank")).to_have_text(str(rank))  # this rank's own frame and variables
        expect(_value(page, "x")).to_have_text(str(rank * 10))
        # what the kernel's debugger hides in a plain cell's variables is hidden in a rank's too
        hidden = page.locator(".jp-DebuggerVariables-name", has_text=re.compile(r"^(debugpy|In|Out)$"))
        expect(hidden).to_have_count(0)
    snapshot(page, "debugger-ranks.png")

    # Continue goes to the chosen rank (rank 1 here): rank 0 stays stopped, and the panel shows it
    page.locator('#jp-debugger-sidebar [title^="Continue"]').first.click()
    expect(status).to_have_text("1 rank stopped")
    expect(select.locator("option")).to_have_text(["rank 0"])
    expect(frames.first).to_contain_text(":4")
    expect(_value(page, "x")).to_have_text("0")
    ranks.get_by_role("button", name="Continue all").click()  # every rank still stopped: rank 0 here
    expect(ranks).to_be_hidden()
    expect(cell.locator(".jp-InputArea-prompt", has_text="[2]")).to_have_count(1, timeout=60_000)
    expect(cell.locator(".jp-OutputArea")).to_contain_text("rank 0 y 1")
    page.locator(".jp-DebuggerBugButton").first.click()  # off again
