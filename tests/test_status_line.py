"""The cell's status line, in a real kernel, as the widget state the notebook stores: a short run name linked to
the run's dashboard tab (the log folder only in hover text), sub-second durations, one word for how a run
ended (the error box says the rest), and a live session's start cell that says when the session stopped."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def kernel(kernel_with):
    return kernel_with("import time")


class StatusLines:
    """The latest value of every nblaunch status-line widget, across the cells run through ``run``."""

    def __init__(self, kernel):
        self.kernel, self.values, self.seen = kernel, {}, []

    def run(self, code: str, **kw):
        cell = self.kernel.run(code, **kw)
        for kind, content in cell.messages:
            if kind in ("comm_open", "comm_msg"):
                value = content.get("data", {}).get("state", {}).get("value")
                if isinstance(value, str) and "<b>nblaunch" in value and "nblaunch-run-link" in value:
                    self.values[content["comm_id"]] = value
                    self.seen.append(value)
        return cell

    def of(self, cell) -> str:
        ids = {c["comm_id"] for k, c in cell.messages if k == "comm_open"}
        return next(v for m, v in self.values.items() if m in ids)


def _visible(html: str) -> str:
    return re.sub(r"<[^>]+>", "", html)


def test_a_run_is_named_shortly_and_linked_to_its_dashboard_with_the_log_folder_on_hover(kernel):
    lines = StatusLines(kernel)
    cell = lines.run("%%distributed -n 2\nx = rank\n").ok()
    status = lines.of(cell)
    link_html = r'<a class="nblaunch-run-link" href="#" data-nblaunch-run="(run-[^"]+)" title="([^"]+)"[^>]*>'
    link_html += r"([^<]+)</a>"
    link = re.search(link_html, status)
    assert link, status
    run_id, title, name = link.groups()
    assert run_id in title and "/" in title  # the log folder, on hover
    assert re.fullmatch(r"run \d\d:\d\d:\d\d", name)
    # one name from one clock: the state file's start, which the sidebar and the dashboard tab name the run by
    started = json.loads((Path(title.split("Logs: ", 1)[1]) / "state.json").read_text())["started"]
    assert name == "run " + time.strftime("%H:%M:%S", time.localtime(started)), (name, started)
    reported = kernel.run("import kernelside; print(repr(kernelside.last_report().started_at))").ok().stdout
    assert float(reported) == started  # the very same instant, not a second apart at a tick
    visible = _visible(status)
    assert "/tmp" not in visible and run_id not in visible
    # sub-second as such ("0.14 s", not "00:00 elapsed"); a loaded machine may take a second or more: "1.2 s"
    assert re.search(r"· (0\.\d\d|\d\.\d) s ·", visible) and "00:00" not in visible, visible
    assert 'data-nblaunch-rank="1"' in status
    # the kernel's first widget cell: JupyterLab's status bar reads Idle now, and the line says so while it runs
    note = "The status bar may say Idle during a kernel's first widget cell: this cell is running."
    assert any(note in v for v in lines.seen[:-1]) and note not in status, lines.seen
    later = StatusLines(kernel)
    later.run("%%distributed -n 2\ntime.sleep(1.5)\n").ok()  # (the status line is drawn again while it runs)
    assert len(later.seen) > 1 and not any(note in v for v in later.seen)  # later cells read Busy: no note


def test_a_failed_or_timed_out_run_says_how_it_ended_once_without_the_stop_boilerplate(kernel):
    lines = StatusLines(kernel)
    cell = lines.run("%%distributed -n 2 --timeout 0.5\ntime.sleep(30)\n")
    assert cell.error["ename"] == "LaunchTimeoutError"
    visible = _visible(lines.of(cell))
    assert visible.startswith("nblaunch: timed out ") and "exceeded" not in visible
    failed = lines.run("%%distributed -n 2\nif rank == 1:\n    raise ValueError('no')\n")
    visible = _visible(lines.of(failed))
    assert visible.startswith("nblaunch: failed ") and visible.count("rank 1 failed: ValueError: no") == 1
    assert "nblaunch: rank" not in visible


def test_the_live_start_cell_says_idle_then_stopped(kernel):
    lines = StatusLines(kernel)
    start = lines.run("%distributed_start -n 2").ok()
    assert ": 2 idle ·" in _visible(lines.of(start))
    # a quick live cell draws no status line (display/deferred_display.py); one with a bar does
    cell = lines.run("%%distributed\nfrom kernelside import progress\nfor y in progress(range(2)):\n    pass\n").ok()
    assert ">live session, cell 1</a>" in lines.of(cell)
    lines.run("%distributed_stop").ok()
    assert "session stopped; nothing is left running" in _visible(lines.of(start))
