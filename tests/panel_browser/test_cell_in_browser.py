"""What a cell shows, in a real JupyterLab and Debian's Chromium: the status line's short run name (a dashboard
link, the log folder on hover), the chart at the cell's width with readable ticks, values on hover and a working
smoothing control, no text on another at 1280 and 800 px wide (the panels wrap, none is cut off),
%distributed_last's linked logs, %distributed_config's invalid value; and what JupyterLab's status bar says while
a cell with widgets runs, with the cell's one-line note during a kernel's first widget cell, in one-shot cells
and in a live session. Screenshots go to test-artifacts/ (`make readme-images` copies the README's into docs/)."""

from __future__ import annotations

import json
import re
import urllib.request

from lab_notebooks import write_notebook
from playwright.sync_api import expect

expect.set_options(timeout=60_000)

METRICS_CELL = """%%distributed -n 2
import math, random, time
from kernelside import log_metrics, progress
random.seed(rank)
for step in progress(range(1, 201), desc="train"):
    log_metrics(step=step, loss=2 * math.exp(-step / 50) + 0.2 * random.random(), lr=1e-3 * min(1, step / 40))
    time.sleep(0.004)
print(f"rank {rank} done")
"""
OUTPUT_ALL = "%%distributed -n 2 --output all\nfor i in range(3):\n    print(f'hello {i} from rank {rank}')"
# (8 s each: the status bar's 20 samples, 0.2 s apart, take longer than 4 s on a loaded machine)
WIDGET_SLEEP = "import ipywidgets, time\ndisplay(ipywidgets.HTML('a widget'))\ntime.sleep(8)"
PLAIN_SLEEP = "time.sleep(8)"
NBLAUNCH_SLEEP = (
    "%%distributed -n 2\nfrom kernelside import progress\nfor _ in progress(range(80)):\n    time.sleep(0.1)"
)


def _shut_down_kernels(lab_server) -> None:
    """End every session of the server (and its kernel), as closing the notebook and shutting down its kernel
    does, through the server's REST API."""
    base = f"{lab_server.url}/api/sessions"
    headers = {"Authorization": f"token {lab_server.token}"}
    with urllib.request.urlopen(urllib.request.Request(base, headers=headers), timeout=30) as reply:
        sessions = json.load(reply)
    for session in sessions:
        request = urllib.request.Request(f"{base}/{session['id']}", method="DELETE", headers=headers)
        urllib.request.urlopen(request, timeout=30).close()


def _run_cell(page, index: int) -> None:
    page.locator(".jp-NotebookPanel .jp-Cell").nth(index).click()
    page.keyboard.press("Control+Enter")


def _kernel_status(page) -> str:
    text = page.locator("#jp-main-statusbar").inner_text()
    found = re.search(r"\b(Busy|Idle)\b", text)
    return found.group(1) if found else text


def _prompt(page, i: int):
    """Cell ``i``'s prompt once it has run (its execution count, as the notebook shows it)."""
    return page.locator(".jp-Cell").nth(i).locator(".jp-InputArea-prompt", has_text=f"[{i + 1}]")


IDLE_NOTE = "The status bar may say Idle during a kernel's first widget cell: this cell is running."
# Every pair of the chart's visible texts (titles, legends, tick labels, value rows) whose boxes overlap
# by more than a pixel, per panel; a hover readout is drawn only while hovered and is left out.
OVERLAPS = """svg => {
  const texts = [...svg.querySelectorAll('text')].filter(t => !t.classList.contains('nbl-readout')
      && getComputedStyle(t).visibility === 'visible' && getComputedStyle(t).display !== 'none'
      && t.textContent.trim());
  const boxes = texts.map(t => [t.textContent, t.getBoundingClientRect()]);
  const hit = [];
  for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
    const [a, p] = boxes[i], [b, q] = boxes[j];
    const w = Math.min(p.right, q.right) - Math.max(p.left, q.left);
    const h = Math.min(p.bottom, q.bottom) - Math.max(p.top, q.top);
    if (w > 1 && h > 1) hit.push(`${a} / ${b}`);
  }
  return {count: boxes.length, hit, width: svg.getBoundingClientRect().width};
}"""


def _status_during(page, index: int, marker_done, snapshot) -> tuple[list[str], int]:
    """Kernel states the status bar shows while cell ``index`` runs (sampled every 0.2 s), and in how many
    samples the cell showed its note on the status bar's Idle (a screenshot of it the first time)."""
    _run_cell(page, index)
    note = page.locator(".jp-NotebookPanel .jp-Cell").nth(index).locator(".nblaunch-idle-note")
    seen, noted = [], 0
    for _ in range(20):
        page.wait_for_timeout(200)
        seen.append(_kernel_status(page))
        if note.count():
            noted += 1
            if noted == 1:
                assert note.inner_text() == IDLE_NOTE
                snapshot(page.locator(".jp-NotebookPanel .jp-Cell").nth(index), f"cell-idle-note-{index}.png")
    expect(marker_done).to_have_count(1, timeout=60_000)
    return seen, noted


def test_status_line_chart_report_and_config_in_a_realwrite_notebook(lab_server, browser_page, snapshot):
    page = browser_page
    page.set_default_timeout(60_000)
    (lab_server.root / "bad.yaml").write_text("num_processes: 2\nmain_process_port: 70000\n")
    cells = ["%load_ext kernelside\nimport time", PLAIN_SLEEP, WIDGET_SLEEP, NBLAUNCH_SLEEP]
    cells += [METRICS_CELL, "%distributed_last", "%distributed_config bad.yaml", OUTPUT_ALL]
    write_notebook(lab_server.root / "train.ipynb", cells)
    widgets = lab_server.root.parent / "settings" / "@jupyter-widgets" / "jupyterlab-manager"
    widgets.mkdir(parents=True, exist_ok=True)
    (widgets / "plugin.jupyterlab-settings").write_text(json.dumps({"saveState": True}))  # widgets in the file
    page.goto(lab_server.page_url("lab/tree/train.ipynb"))
    expect(page.locator("#jp-main-statusbar")).to_contain_text("Idle")  # the kernel is up
    _run_cell(page, 0)
    expect(_prompt(page, 0)).to_have_count(1)

    # JupyterLab's status bar while cells run (issue 21, item 9). The kernel's first widget, here ipywidgets'
    # own, makes JupyterLab open a subshell for widget comms (commsOverSubshells: perCommTarget); the kernel's
    # idle status for that control request turns the status bar to Idle while the cell still runs. Once the
    # subshell exists, a cell with nblaunch's widgets reads Busy like any other.
    samples = [_status_during(page, i, _prompt(page, i), snapshot) for i in (1, 2, 3)]
    (plain, _), (first_widget, _), (ours, noted) = samples
    print("status bar while a cell runs: plain", plain, "first ipywidgets", first_widget, "nblaunch", ours)
    assert plain.count("Busy") >= 15, plain
    assert first_widget.count("Idle") >= 10, first_widget
    assert ours.count("Busy") >= 15, ours
    assert noted == 0  # not the kernel's first widget cell: no note on the status bar

    for i in range(4, 8):
        _run_cell(page, i)
    cell = page.locator(".jp-NotebookPanel .jp-Cell").nth(4)
    chart = cell.locator("div.nblaunch-chart")
    expect(cell.locator(".nbl-smoothing")).to_have_count(1, timeout=120_000)  # the run ended: final chart

    link = cell.locator("a.nblaunch-run-link")
    expect(link).to_have_text(re.compile(r"^train \d\d:\d\d:\d\d$"))
    assert re.fullmatch(r"run-[\w-]+", link.get_attribute("data-nblaunch-run"))
    assert "/nblaunch-" in link.get_attribute("title")  # the log folder, on hover
    assert "/tmp" not in cell.locator(".widget-html").first.inner_text()

    # the chart fills the output area's width; no tick label is under 11 px
    area = cell.locator(".jp-OutputArea-output").first.bounding_box()
    box = chart.bounding_box()
    assert box["width"] >= 0.9 * area["width"] - 20, (box, area)
    sizes = chart.evaluate(
        "svg => [...svg.querySelectorAll('text')].map(t => parseFloat(getComputedStyle(t).fontSize))"
    )
    assert sizes and min(sizes) >= 11, sizes

    # hovering the plot: the band under the pointer holds the values at that step
    chart.scroll_into_view_if_needed()
    plot = chart.locator("svg[preserveAspectRatio='none']").first.bounding_box()
    x, y = plot["x"] + plot["width"] * 0.5, plot["y"] + plot["height"] * 0.5
    page.mouse.move(x, y)
    tip = page.evaluate(
        "([x, y]) => { const e = document.elementFromPoint(x, y); const t = e && e.querySelector('title');"
        " return t ? t.textContent : (e ? e.outerHTML.slice(0, 80) : null); }",
        [x, y],
    )
    assert re.match(r"loss at step \d+: [\d.]+ \(smoothed [\d.]+\)", tip or ""), tip
    values = re.compile(r"^loss at step \d+: [\d.]+ \(smoothed [\d.]+\)$")
    readout = chart.locator(".nbl-readout").filter(has_text=values)
    visible = readout.evaluate_all("ts => ts.filter(t => getComputedStyle(t).visibility === 'visible').length")
    assert visible == 1, visible  # the hovered step's values, written on the panel at once
    cell.scroll_into_view_if_needed()
    snapshot(cell, "cell-status-and-chart.png")

    # no title, legend or tick label on another, at the default width and at 800 px
    page.mouse.move(5, 5)
    wide = chart.evaluate(OVERLAPS)
    assert wide["count"] >= 10 and wide["hit"] == [], wide
    page.set_viewport_size({"width": 800, "height": 900})
    chart.evaluate(  # JupyterLab lays the notebook out again: the chart follows the cell's width
        "(svg, w) => new Promise(done => { const narrower = () => svg.getBoundingClientRect().width < w - 200"
        " ? done() : requestAnimationFrame(narrower); narrower(); })",
        wide["width"],
    )
    narrow = chart.evaluate(OVERLAPS)
    assert narrow["count"] >= 10 and narrow["hit"] == [], narrow
    # every panel whole inside the output area: a narrow cell wraps the panels into rows, none is cut off
    area = cell.locator(".jp-OutputArea-output").first.bounding_box()
    shown = chart.locator("svg.nbl-panel")
    panels = [shown.nth(i).bounding_box() for i in range(shown.count())]
    right = area["x"] + area["width"] + 1
    assert len(panels) == 2 and all(p["x"] + p["width"] <= right for p in panels), (panels, area)
    assert panels[1]["y"] > panels[0]["y"] + panels[0]["height"] - 1, panels  # the second panel: on the next row
    cell.scroll_into_view_if_needed()
    snapshot(cell, "cell-chart-800px.png")
    page.set_viewport_size({"width": 1280, "height": 900})

    # the smoothing control switches the line drawn, with no kernel involved
    def shown(cls: str) -> int:
        return chart.evaluate(
            f"svg => [...svg.querySelectorAll('.{cls}')].filter(e => getComputedStyle(e).display !== 'none').length"
        )

    assert shown("nbl-ema-6") == 1 and shown("nbl-ema-9") == 0  # the loss; the lr schedule is not smoothed
    cell.locator(".nbl-smoothing label", has_text=re.compile(r"^0\.9$")).click()
    assert shown("nbl-ema-9") == 1 and shown("nbl-ema-6") == 0
    snapshot(cell, "cell-chart-smoothing-0.9.png")

    report = page.locator(".jp-NotebookPanel .jp-Cell").nth(5)
    logs = report.locator("a.nblaunch-log-link")
    expect(logs).to_have_count(2)
    assert logs.nth(1).inner_text() == "rank1.log" and logs.nth(1).get_attribute("title").endswith("/rank1.log")
    snapshot(report, "distributed-last.png")

    config = page.locator(".jp-NotebookPanel .jp-Cell").nth(6)
    expect(config).to_contain_text("invalid, allowed: an integer from 1 to 65535 or empty")
    snapshot(config, "distributed-config.png")

    # --output all: a tab per rank, rank 0 shown; rank 1's tab shows its lines, and the choice is saved
    every = page.locator(".jp-NotebookPanel .jp-Cell").nth(7)
    shown = every.locator(".widget-tab .widget-html-content:visible")  # the selected tab's page only
    expect(shown).to_contain_text("hello 2 from rank 0")
    expect(shown).not_to_contain_text("from rank 1")
    every.get_by_role("tab", name="rank 1").click()
    expect(shown).to_contain_text("hello 2 from rank 1")
    expect(shown).not_to_contain_text("from rank 0")
    snapshot(every, "cell-output-all-tabs.png")
    page.keyboard.press("Control+s")
    nb_file = lab_server.root / "train.ipynb"

    def saved_tab() -> int | None:
        try:
            saved = json.loads(nb_file.read_text())
        except json.JSONDecodeError:  # caught mid-save: Jupyter's server writes the file in place (its backup aside)
            return None
        state = saved["metadata"].get("widgets", {})
        models = state.get("application/vnd.jupyter.widget-state+json", {}).get("state", {}).values()
        return next((m["state"]["selected_index"] for m in models if m["model_name"] == "TabModel"), None)

    for _ in range(100):
        if saved_tab() == 1:
            break
        page.wait_for_timeout(100)
    assert saved_tab() == 1

    # reopened with a new kernel (the widgets come from the notebook file's saved state): rank 1's tab is shown
    _shut_down_kernels(lab_server)
    page.goto(lab_server.page_url("lab/tree/train.ipynb") + "&reset")
    every = page.locator(".jp-NotebookPanel .jp-Cell").nth(7)
    shown = every.locator(".widget-tab .widget-html-content:visible")
    expect(shown).to_contain_text("hello 2 from rank 1")
    expect(shown).not_to_contain_text("from rank 0")
    expect(every.get_by_role("tab", name="rank 1")).to_have_attribute("aria-selected", "true")
    every.scroll_into_view_if_needed()
    snapshot(every, "cell-output-all-tabs-reopened.png")

    # With comms over subshells disabled in JupyterLab's settings, nblaunch's first widgets leave it Busy.
    settings = lab_server.root.parent / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True, exist_ok=True)
    (settings / "kernels-settings.jupyterlab-settings").write_text(json.dumps({"commsOverSubshells": "disabled"}))
    write_notebook(lab_server.root / "first.ipynb", ["%load_ext kernelside\nimport time", NBLAUNCH_SLEEP])
    page.goto(lab_server.page_url("lab/tree/first.ipynb") + "&reset")  # only this notebook open
    expect(page.locator("#jp-main-statusbar")).to_contain_text("Idle")
    _run_cell(page, 0)
    expect(_prompt(page, 0)).to_have_count(1)
    ours_first, noted = _status_during(page, 1, _prompt(page, 1), snapshot)
    print("nblaunch's first widgets, comms over subshells disabled:", ours_first, "note in", noted, "samples")
    assert ours_first.count("Busy") >= 15, ours_first
    # the kernel's first widget cell says, in one line, that an Idle status bar does not mean it stopped
    # (the kernel cannot tell whether JupyterLab uses a subshell), and the line goes when the cell ends
    assert noted >= 3, noted
    expect(page.locator(".jp-NotebookPanel .jp-Cell").nth(1).locator(".nblaunch-idle-note")).to_have_count(0)


LIVE_SLEEP = "%%distributed\nfrom kernelside import progress\nfor _ in progress(range(80)):\n    time.sleep(0.1)"


def test_the_status_bar_during_a_live_sessions_first_cells(lab_server, browser_page, snapshot):
    """A fresh kernel's live session: while %distributed_start and then the first live %%distributed cell run,
    every moment JupyterLab's status bar reads Idle, the running cell says in its one line that it is running."""
    page = browser_page
    page.set_default_timeout(60_000)
    cells = ["%load_ext kernelside\nimport time", "%distributed_start -n 2", LIVE_SLEEP, "%distributed_stop"]
    write_notebook(lab_server.root / "live_first.ipynb", cells)
    page.goto(lab_server.page_url("lab/tree/live_first.ipynb") + "&reset")
    expect(page.locator("#jp-main-statusbar")).to_contain_text("Idle")
    _run_cell(page, 0)
    expect(_prompt(page, 0)).to_have_count(1)
    _run_cell(page, 1)
    start = page.locator(".jp-NotebookPanel .jp-Cell").nth(1)
    starting = []
    while not _prompt(page, 1).count() and len(starting) < 600:
        starting.append((_kernel_status(page), start.locator(".nblaunch-idle-note").count() > 0))
        page.wait_for_timeout(200)
    print("%distributed_start: status bar and note", starting)
    assert starting and all(status == "Busy" or noted for status, noted in starting[1:]), starting
    expect(_prompt(page, 1)).to_have_count(1, timeout=120_000)
    _run_cell(page, 2)
    cell = page.locator(".jp-NotebookPanel .jp-Cell").nth(2)
    note = cell.locator(".nblaunch-idle-note")
    samples = []
    for _ in range(20):
        page.wait_for_timeout(200)
        status, noted = _kernel_status(page), note.count() > 0
        samples.append((status, noted))
        if noted and sum(n for _, n in samples) == 1:
            assert note.inner_text() == IDLE_NOTE
            snapshot(cell, "cell-idle-note-live.png")
    expect(_prompt(page, 2)).to_have_count(1, timeout=60_000)
    print("the first live cell: status bar and note", samples)
    unexplained = [i for i, (status, noted) in enumerate(samples) if status == "Idle" and not noted]
    # the status bar may turn Idle only once the cell's widgets are up (the note comes with them): allow the
    # first sample, taken before the cell's first output
    assert [i for i in unexplained if i > 0] == [], samples
    assert sum(status == "Busy" or noted for status, noted in samples) >= 15, samples
    expect(note).to_have_count(0)  # the cell is over: its note goes
    _run_cell(page, 3)
    expect(_prompt(page, 3)).to_have_count(1, timeout=60_000)
