"""A live cell's display in a real kernel: nothing drawn for a quick cell, everything once there is something.

A quick live cell (``x = 1``) must cost the notebook what a plain cell costs: no widget comm opened, no display
message, only what it prints, returns or raises. A cell with a progress bar, a metrics point, or one that runs
past ``SHOW_AFTER_S`` draws the status line, bars and chart as a one-shot launch does.
"""

from __future__ import annotations

import pytest

from kernelside.display.deferred_display import SHOW_AFTER_S


@pytest.fixture(scope="module")
def kernel(kernel_with):
    k = kernel_with("import time\nfrom kernelside import progress, log_metrics", "%distributed_start -n 2", timeout=180)
    yield k
    k.run("%distributed_stop").ok()


def _widget_models(cell) -> list[str]:
    return [c["data"]["state"].get("_model_name") for k, c in cell.messages if k == "comm_open"]


def test_a_quick_live_cell_sends_only_what_it_prints_returns_or_raises(kernel):
    cell = kernel.run("%%distributed\nx = rank + 1").ok()
    assert [kind for kind, _ in cell.messages] == ["status", "execute_input"]
    cell = kernel.run("%%distributed\nprint('x is', x)\nx * 10").ok()
    assert cell.stdout == "x is 1\n" and cell.result["text/plain"] == "10"
    assert _widget_models(cell) == [] and not any(k == "display_data" for k, _ in cell.outputs)
    cell = kernel.run("%%distributed\nif rank == 1:\n    raise ValueError('bad cell')")
    assert cell.error is not None and "rank 1 failed: ValueError: bad cell" in "\n".join(cell.error["traceback"])
    assert _widget_models(cell) == []


def test_a_cell_on_one_rank_of_the_session_prints_its_lines_named_by_rank_and_draws_no_tab(kernel):
    # (--ranks 1 shows every line of the ranks it runs on: one rank's need no tab, and no empty tab of rank 0)
    cell = kernel.run("%%distributed --ranks 1\nprint('on', rank)").ok()
    assert cell.stdout == "[rank 1] on 1\n"
    assert _widget_models(cell) == [] and not any(k == "display_data" for k, _ in cell.outputs)


def test_a_live_cell_with_a_bar_or_a_metric_draws_them(kernel):
    cell = kernel.run("%%distributed\nfor i in progress(range(4)):\n    pass").ok()
    assert "FloatProgressModel" in _widget_models(cell)
    cell = kernel.run("%%distributed\nlog_metrics(step=0, loss=1.0)").ok()
    assert "HTMLModel" in _widget_models(cell)


def test_a_live_cell_running_past_the_threshold_shows_its_status_line(kernel):
    cell = kernel.run(f"%%distributed\ntime.sleep({SHOW_AFTER_S + 0.5})").ok()
    states = [c["data"]["state"] for k, c in cell.messages if k == "comm_open"]
    updates = [c["data"]["state"].get("value", "") for k, c in cell.messages if k == "comm_msg"]
    shown = [s.get("value", "") for s in states if s.get("_model_name") == "HTMLModel"] + updates
    assert any("<b>nblaunch</b>" in v and "live session" in v for v in shown), shown
