"""output="none" means the same on every engine: nothing in the cell, text bars in the rank logs."""

from __future__ import annotations

import pytest

from kernelside import last_report, notebook_launcher, progress
from kernelside.config import resolve_config
from kernelside.display.progress_view import render_mode
from kernelside.engines.table import engine_class
from kernelside.launch.plan import make_plan
from kernelside.launch.request import LaunchRequest


def _bars():
    for _ in progress(range(50), desc="quiet-bar"):
        pass
    return 1


def test_output_none_writes_text_bars_to_rank0s_log_and_nothing_to_the_cell(capfd, no_leaks):
    assert notebook_launcher(_bars, num_processes=2, output="none") == 1
    shown = capfd.readouterr()
    assert "quiet-bar" not in shown.out + shown.err
    log = open(last_report().ranks[0].log_path).read()
    assert "quiet-bar: 100%" in log and "50/50" in log


def _plan(**values):
    return make_plan(resolve_config(values), gpus=0, cuda_initialized=False)


@pytest.mark.parametrize(
    "engine, values",
    [
        ("local", {}),
        ("elastic", {"num_machines": 2, "main_process_ip": "127.0.0.1", "num_processes": 2}),
        ("ray", {"engine": "ray"}),
    ],
)
def test_every_engine_gives_its_ranks_text_bars_for_output_none(engine, values, tmp_path):
    plan = _plan(output="none", **values)
    assert plan.engine == engine
    made = engine_class(engine)(LaunchRequest(fn=_bars), plan, str(tmp_path), None, None, render=render_mode("none"))
    assert made.render == "text"


def test_engines_without_an_event_pipe_draw_text_where_the_local_engine_draws_widgets(tmp_path):
    plan = _plan(num_machines=2, main_process_ip="127.0.0.1", num_processes=2)
    assert engine_class("elastic")(
        LaunchRequest(fn=_bars), plan, str(tmp_path), None, None, render="widgets"
    ).render == ("text")
