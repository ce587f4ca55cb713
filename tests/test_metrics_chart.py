"""The metrics chart: fills the cell's width with text never under 11 px, values on hover, TensorBoard's smoothing
with a control once the run has ended, theme colours for text; and, in a real kernel, at most two chart updates
a second and the final chart stored with the notebook's widget state."""

from __future__ import annotations

import math
import re
import time

import pytest

from kernelside.display.chart_scales import ema, is_noisy
from kernelside.display.metrics_chart import MetricsChart

POINTS = [{"step": i, "loss": 2 * math.exp(-i / 30) + (0.1 if i % 2 else 0.0), "lr": 1e-3} for i in range(1, 121)]


def test_the_chart_fills_the_cell_width_and_no_text_is_under_11px():
    svg = MetricsChart().render(POINTS, final=True)
    assert re.match(r'<div class="nblaunch-chart" style="display: flex; flex-wrap: wrap; [^"]*width: 100%', svg)
    # two panels a row at most here, each a half less the gap and never under 280 px: a narrow cell wraps them
    panels = re.findall(r'<svg [^>]*class="nbl-panel" height="190" style="flex: 1 1 ([^;]*); min-width: 280px', svg)
    assert panels == ["calc(50.000% - 5.00px)"] * 2, panels
    assert "font: 12px" in svg
    sizes = [float(s) for s in re.findall(r'font-size="([\d.]+)"', svg)]
    assert all(s >= 11 for s in sizes), sizes
    assert "<text" in svg and 'fill="#' not in re.sub(r"<(rect|circle|polyline)[^>]*>", "", svg)  # text: theme colour
    assert "var(--jp-ui-font-color1" in svg


def test_hovering_a_step_shows_its_value_and_the_smoothed_value():
    svg = MetricsChart().render(POINTS)
    smoothed = ema([p["loss"] for p in POINTS], 0.6)[-1]
    last = POINTS[-1]["loss"]
    assert f"<title>loss at step 120: {last:.4g} (smoothed {smoothed:.4g})</title>" in svg
    assert len(re.findall(r"<title>loss at step", svg)) <= 101  # bands, not one per point for long runs
    # a visible readout at the hovered step, not only the browser's late tooltip: shown by CSS on :hover
    readout = f"loss at step 120: {last:.4g} (smoothed {smoothed:.4g})"
    assert f'<text class="nbl-readout" x="8" y="18">{readout}</text></g>' in svg
    assert ".nbl-panel:has(.nbl-band:hover) .nbl-head{visibility:hidden}" in svg  # in the title's place
    assert ".nbl-band:hover .nbl-readout" in svg and ".nbl-rule,.nbl-readout{visibility:hidden}" in svg


def test_a_panels_legend_sits_in_its_own_row_clear_of_the_title_and_the_top_tick_label():
    two = [{"step": i, "loss": 1.2 - i / 100 + (0.01 if i % 2 else 0), "rank": r} for i in range(40) for r in (0, 1)]
    svg = MetricsChart().render(two)
    legend = re.search(r'<svg class="nbl-head" x="17%" y="0" overflow="visible">(.*?)</svg>', svg).group(1)
    legend_y = {float(y) for y in re.findall(r'<text x="[\d.]+" y="([\d.]+)"', legend)}
    top_tick = min(float(y) for y in re.findall(r'<text x="15.5%" y="([\d.]+)" text-anchor="end"', svg))
    assert legend_y == {33.0} and top_tick - 33.0 >= 11  # 11 px fonts: one line apart, no overlap
    assert "rank 0: " in legend and "rank 1: " in legend


def test_smoothing_is_a_debiased_ema_drawn_over_the_faint_raw_line():
    assert ema([3.0, 3.0, 3.0], 0.9) == pytest.approx([3.0, 3.0, 3.0])  # no pull towards 0 at the start
    assert ema([1.0, 2.0], 0.0) == [1.0, 2.0]
    during = MetricsChart().render(POINTS)
    # the noisy loss is smoothed; the learning rate, a schedule without noise, is drawn as it is
    assert during.count('class="nbl-ema nbl-ema-6"') == 1 and 'class="nbl-ema nbl-ema-9"' not in during
    assert "<input" not in during
    assert re.search(r'class="nbl-raw"[^>]*stroke-opacity="0.5"', during)  # seen on dark backgrounds too
    assert re.search(r'class="nbl-raw"[^>]*stroke-opacity="1"', during)  # the schedule: its own line, whole


def test_smoothing_applies_per_panel_only_to_series_with_noise():
    assert is_noisy([2 * math.exp(-i / 30) + (0.1 if i % 2 else 0.0) for i in range(100)])
    warmup_cosine = [i / 10 for i in range(10)] + [0.5 * (1 + math.cos(math.pi * i / 90)) for i in range(90)]
    steps = [1e-3] * 30 + [1e-4] * 30 + [1e-5] * 30
    assert not is_noisy(warmup_cosine) and not is_noisy(steps) and not is_noisy([3.0] * 50)
    only_lr = [{"step": i, "lr": 1e-3 * 0.99**i} for i in range(50)]
    svg = MetricsChart().render(only_lr, final=True)
    assert 'class="nbl-ema' not in svg and "<input" not in svg  # nothing to smooth: no control either


def test_the_ended_run_gets_a_smoothing_control_with_every_weight_precomputed():
    svg = MetricsChart().render(POINTS, final=True)
    values = re.findall(r'<input type="radio" name="(nbl-smooth-[0-9a-f]+)" value="([\d.]+)"( checked)?', svg)
    assert [v for _, v, _ in values] == ["0", "0.6", "0.9", "0.99"]
    assert [v for _, v, c in values if c] == ["0.6"] and len({n for n, _, _ in values}) == 1
    assert all(f"nbl-ema-{k}" in svg for k in ("6", "9", "99"))
    assert ':has(input[value="0.9"]:checked) .nbl-ema-9{display:inline}' in svg
    other = MetricsChart().render(POINTS, final=True)
    assert re.search(r'name="(nbl-smooth-[0-9a-f]+)"', other).group(1) != values[0][0]  # charts apart


def test_the_chart_updates_at_most_twice_a_second_however_fast_ranks_log(kernel):
    updates = []
    t0 = time.monotonic()
    cell = kernel.run(
        "%%distributed -n 2\nimport time\nfrom kernelside import log_metrics\nt0 = time.monotonic()\nstep = 0\n"
        "while time.monotonic() - t0 < 3:\n    step += 1\n    log_metrics(step=step, loss=1 / step)\n"
        "    time.sleep(0.002)\n"
    ).ok()
    wall = time.monotonic() - t0
    for kind, content in cell.messages:
        state = content.get("data", {}).get("state", {})
        if kind == "comm_msg" and str(state.get("value", "")).startswith('<div class="nblaunch-chart"'):
            updates.append(content["comm_id"])
    assert updates
    assert len(updates) <= 2 * wall + 2, (len(updates), wall)
