"""End to end: the panel in a real JupyterLab and browser edits nblaunch.yaml, and the cell it
inserts runs on as many workers as the panel saved."""

from __future__ import annotations

import re

import yaml
from playwright.sync_api import expect

PANEL = "#nblaunch-panel"
# Assertions wait for the page as long as actions do: on a loaded 2-core machine the hardware
# probe (a child interpreter importing torch) and the kernel start can take many seconds.
expect.set_options(timeout=60_000)


def test_panel_saves_config_and_its_inserted_cell_runs_on_three_workers(lab_server, browser_page, snapshot):
    page = browser_page
    page.set_default_timeout(60_000)
    try:
        # Opening the notebook first lets its kernel start while the panel is edited.
        page.goto(lab_server.page_url("lab/tree/demo.ipynb"))
        page.locator('.jp-SideBar [data-id="nblaunch-panel"]').click()
        panel = page.locator(PANEL)
        expect(panel.locator(".nblaunch-path")).to_contain_text("nblaunch.yaml")
        expect(panel.locator(".nblaunch-hardware-facts")).to_contain_text("CPU cores")

        # a message sits under Save and goes once what it asks for is done
        panel.locator('input[name="num_processes"]').fill("-1")
        panel.get_by_role("button", name="Save", exact=True).click()
        expect(panel.locator(".nblaunch-save-bar .nblaunch-status")).to_have_text("Fix the fields marked in red first.")
        panel.locator('input[name="num_processes"]').fill("3")
        expect(panel.locator(".nblaunch-status")).to_have_text("")
        panel.locator('select[name="mixed_precision"]').select_option("bf16")
        expect(panel.locator(".nblaunch-dirty-note")).to_be_visible()
        expect(panel.locator('[data-field="num_processes"]')).to_have_class(re.compile("nblaunch-mod-dirty"))

        panel.get_by_role("button", name="Save", exact=True).click()
        expect(panel.locator(".nblaunch-status")).to_have_text("Saved to nblaunch.yaml.")
        expect(panel.locator(".nblaunch-dirty-note")).to_be_hidden()
        saved = yaml.safe_load((lab_server.root / "nblaunch.yaml").read_text())
        assert saved == {"num_processes": 3, "mixed_precision": "bf16"}
        snapshot(panel, "panel.png")

        page.locator(".jp-NotebookPanel .jp-Cell").first.click()  # the notebook the cell goes into is current
        panel.get_by_role("button", name="Insert %%distributed cell").click()
        cells = page.locator(".jp-NotebookPanel .jp-Cell .jp-InputArea-editor")
        expect(cells).to_have_count(3)
        expect(cells.nth(1)).to_contain_text("%load_ext kernelside")
        expect(cells.nth(2)).to_contain_text("%%distributed")

        page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
        page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
        outputs = page.locator(".jp-NotebookPanel .jp-OutputArea-output")
        expect(outputs.filter(has_text="world_size == 3")).to_have_count(1, timeout=150_000)

        # the export button inserts a cell (the panel never runs code itself); running it writes the
        # script and prints the torchrun command for the 3 processes the panel saved
        page.locator(".jp-NotebookPanel .jp-Cell").nth(2).click()
        panel.get_by_role("button", name="Insert %distributed_export cell").click()
        expect(cells).to_have_count(4)
        expect(cells.nth(3)).to_contain_text("%distributed_export train_distributed.py")
        page.keyboard.press("Shift+Enter")
        expect(outputs.filter(has_text="--nproc-per-node 3")).to_have_count(1, timeout=60_000)
        assert (lab_server.root / "train_distributed.py").is_file()
    finally:
        snapshot(page, "panel-e2e-last-page.png")
