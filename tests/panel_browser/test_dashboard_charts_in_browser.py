"""End to end: a 4-rank run in a real JupyterLab (1280x720) in which rank 2 is made slower on purpose.
Its dashboard names rank 2 as the slowest and by how much, draws CPU, memory and steps per second per
rank as charts with a time axis and value ticks in their units, the training curve the cell draws,
and reads every rank's value at the hovered time; in light and dark themes (screenshots in
test-artifacts/, for people to look at). With a (forged) NVML, each rank's GPU utilisation and memory too."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from lab_notebooks import write_notebook
from lab_process import run_lab
from playwright.sync_api import expect

PANEL = "#nblaunch-panel"
expect.set_options(timeout=60_000)

SLOW_RANK_CELL = """%%distributed -n 4
import time
from kernelside import log_metrics, progress
for step in progress(range(400), desc="train"):
    time.sleep(0.25 if rank == 2 else 0.08)   # rank 2: a third of the others' pace
    log_metrics(step=step, loss=2.0 / (1 + step) + 0.05)
"""


def _run_all(page, lab, name: str, cell: str):
    """``name`` with ``cell`` after ``%load_ext``, opened at 1280x720 with the launch panel shown, Run All:
    the panel's entry of the run once it is running."""
    page.set_viewport_size({"width": 1280, "height": 720})
    page.set_default_timeout(60_000)
    write_notebook(lab.root / name, ["%load_ext kernelside", cell])
    page.goto(lab.page_url(f"lab/tree/{name}"))
    page.locator('.jp-SideBar [data-id="nblaunch-panel"]').click()
    page.locator(".jp-NotebookPanel .jp-Cell").first.click()
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
    run = page.locator(PANEL).locator('.nblaunch-run[data-state="running"]')
    expect(run).to_have_count(1, timeout=150_000)
    return run


def test_dashboard_names_the_slow_rank_and_charts_every_rank_with_axes_and_a_hover_readout(
    lab_server, browser_page, snapshot
):
    page = browser_page
    run = _run_all(page, lab_server, "slow.ipynb", SLOW_RANK_CELL)
    run.locator(".nblaunch-run-open").click()
    dash = page.locator(".nblaunch-dashboard")

    # the slowest rank, named with its pace and how far below the median (about 69 %: 4 against 12.5 steps/s)
    pace = dash.locator(".nblaunch-dash-pace")
    expect(pace).to_have_attribute("data-straggler", "2", timeout=90_000)
    expect(pace).to_have_text(re.compile(r"^rank 2 is the slowest: [\d.]+ steps/s, [4-8]\d% below the median of"))

    charts = dash.locator(".nblaunch-chart")
    for title in ("CPU per rank", "Memory per rank (resident)", "Steps per second per rank", "loss"):
        expect(dash.locator(f'.nblaunch-chart[data-title="{title}"]')).to_have_count(1)
    cpu = dash.locator('.nblaunch-chart[data-title="CPU per rank"]')
    expect(cpu.locator(".nblaunch-chart-key")).to_have_text(["rank 0", "rank 1", "rank 2", "rank 3"])
    expect(cpu.locator("text.nblaunch-chart-tick").first).to_have_text("0%")
    percents = cpu.locator("text.nblaunch-chart-tick", has_text=re.compile(r"^\d+%$")).all_text_contents()
    assert max(int(p[:-1]) for p in percents) in (10, 25, 50, 100), percents  # the axis' top: a round step
    expect(cpu.locator("text.nblaunch-chart-tick", has_text=re.compile(r"^\d+:\d\d$")).first).to_be_visible()
    memory = dash.locator('.nblaunch-chart[data-title="Memory per rank (resident)"]')
    expect(memory.locator("text.nblaunch-chart-tick", has_text=re.compile(r"^\d+ [MG]iB$")).first).to_be_visible()
    expect(cpu.locator("path.nblaunch-chart-line")).to_have_count(4)
    # sized to the tab: the charts share its width, none is a thumbnail
    widths = [charts.nth(i).bounding_box()["width"] for i in range(charts.count())]
    assert min(widths) >= 360, widths

    # hover: every rank's value at that time, and the readout says when
    box = cpu.locator("svg").bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.6, box["y"] + box["height"] / 2)
    readout = cpu.locator(".nblaunch-chart-readout")
    expect(readout).to_have_attribute("data-hovering", "true")
    expect(readout).to_have_text(re.compile(r"^at \d+:\d\d: rank 0 (\d+%|–) · rank 1 .* · rank 3 (\d+%|–)$"))
    expect(cpu.locator("line.nblaunch-chart-rule")).to_have_attribute("visibility", "visible")
    snapshot(page, "dashboard-charts-light.png")
    page.mouse.move(5, 5)
    expect(readout).to_have_attribute("data-hovering", "false")

    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Settings$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Theme$")).hover()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^JupyterLab Dark$")).click()
    expect(page.locator("body")).to_have_attribute("data-jp-theme-light", "false")
    dash.locator(".nblaunch-chart-grid").first.scroll_into_view_if_needed()
    snapshot(page, "dashboard-charts-dark.png")
    dash.locator('.nblaunch-chart[data-title="loss"]').scroll_into_view_if_needed()
    snapshot(page, "dashboard-curves-dark.png")

    dash.get_by_role("button", name="Stop", exact=True).click()
    page.locator(".jp-Dialog").get_by_role("button", name="Stop every rank").click()
    expect(dash).to_have_attribute("data-state", "stopped", timeout=60_000)


GPU_CELL = """%%distributed -n 2
import time
from kernelside import progress
for step in progress(range(300), desc="train"):
    time.sleep(0.1)
"""


def test_with_gpus_the_dashboard_charts_each_ranks_gpu_utilisation_and_memory(
    tmp_path, starts_kernels, browser_page, snapshot
):
    """The GPU charts' layout, seen: the lab server's NVML is the forged driver of forged_driver/pynvml.py
    (two GPUs; rank 0's process on GPU 0, rank 1's on GPU 1), the ranks themselves run on CPU as always."""
    forged = tmp_path / "forged-nvml.json"
    env = {"PYTHONPATH": str(Path(__file__).parent / "forged_driver"), "NBLAUNCH_TEST_FORGED_NVML": str(forged)}
    with run_lab(sys.executable, tmp_path, "jupyter-lab-gpu.log", env=env) as lab:
        page = browser_page
        run = _run_all(page, lab, "gpu.ipynb", GPU_CELL)
        states = sorted(Path(lab.root.parent / "tmp").glob("nblaunch-*/run-*/state.json"))
        assert states, list(Path(lab.root.parent / "tmp").rglob("*"))[:20]
        pids = [r["pid"] for r in json.loads(states[-1].read_text())["ranks"]]
        forged.write_text(json.dumps({"0": [[pids[0], 3 * 2**30, 80]], "1": [[pids[1], 5 * 2**30, 45]]}))
        run.locator(".nblaunch-run-open").click()
        dash = page.locator(".nblaunch-dashboard")
        titles = ["CPU per rank", "Memory per rank (resident)", "GPU utilisation per rank", "GPU memory per rank"]
        for title in titles[2:]:
            expect(dash.locator(f'.nblaunch-chart[data-title="{title}"]')).to_have_count(1, timeout=60_000)
        util = dash.locator('.nblaunch-chart[data-title="GPU utilisation per rank"]')
        memory = dash.locator('.nblaunch-chart[data-title="GPU memory per rank"]')
        expect(util.locator("path.nblaunch-chart-line")).to_have_count(2)
        expect(memory.locator("text.nblaunch-chart-tick", has_text=re.compile(r"^\d+ GiB$")).first).to_be_visible()
        expect(dash.locator("th", has_text=re.compile(r"^GPU$"))).to_have_count(1)  # the table's GPU column
        # sized to the tab like the others: four charts, none a thumbnail, two a row at 1280 px
        charts = dash.locator(".nblaunch-chart-grid").first.locator(".nblaunch-chart")
        boxes = [charts.nth(i).bounding_box() for i in range(charts.count())]
        assert len(boxes) >= 4 and min(b["width"] for b in boxes) >= 360, boxes
        # several samples in: the lines move over time (the forged utilisation swings by 10 points)
        page.wait_for_function(  # (the chart draws its paths anew at each sample: asked by selector each time)
            "() => { const p = document.querySelector("
            "'.nblaunch-chart[data-title=\"GPU utilisation per rank\"] path.nblaunch-chart-line');"
            " return p && (p.getAttribute('d') || '').split('L').length >= 8; }",
            timeout=60_000,
        )
        util.scroll_into_view_if_needed()
        expect(util.locator(".nblaunch-chart-readout")).to_contain_text("rank 1")
        snapshot(page, "dashboard-gpu-charts.png")
        dash.get_by_role("button", name="Stop", exact=True).click()
        page.locator(".jp-Dialog").get_by_role("button", name="Stop every rank").click()
        expect(dash).to_have_attribute("data-state", "stopped", timeout=60_000)
