"""The live metrics chart: one panel per metric, each a self-contained SVG, in a row that fills the cell's width.

Each metric gets its own panel with its own scale (a loss of 0.01 is never flattened by a learning-rate or an
epoch counter), ticks and values on both axes, its name and latest value in the title, and a log scale when its
values are positive and span two decades (100x) or more. With ``progress="all"`` a panel has one line per rank.
A metric logged once (Trainer's ``train_runtime``, say) is a value, not a curve: it is listed under the panels.

Why hand-written SVG rather than a charting library: the chart is the value of an ipywidgets HTML widget
(``progress_view.RunDisplay``), which is stored with the notebook and shown again, offline and without a
kernel, when it is reopened or exported; a widget's HTML runs no script, so a JavaScript library could not draw
there, and a widget of its own would tie the notebook to that library's extension. What a library would add,
this does with the browser alone:

- width: the panels share a wrapping flex row (up to three across, never narrower than ``MIN_PANEL_W``), so
  they follow the cell's width and a narrow cell puts fewer panels in a row instead of cutting one off; inside
  a panel, positions are percent of its width while text stays at 12 px (never scaled down);
- values on hover: each panel has bands with an SVG ``<title>`` (step, value, smoothed value);
- smoothing: TensorBoard's debiased EMA as a solid line over the faint raw one; once the run has ended, a
  small control (off, 0.6, 0.9, 0.99) switches between precomputed lines with CSS alone;
- contrast: text, axes and grid take JupyterLab's theme colours (``--jp-ui-font-color1``), so light and
  dark themes both read well; series colours are mid-luminance.

Example::

    >>> chart = MetricsChart()
    >>> svg = chart.render([{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.5}])
    >>> "loss: last 1.5 (2 points)" in svg
    True
"""

from __future__ import annotations

import html
import math
import secrets

from .chart_scales import (
    ema,
    finite,
    fmt_log,
    fmt_tick,
    fmt_value,
    is_noisy,
    log_ticks,
    nice_ticks,
    span,
    thin,
)

COLORS = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#b279a2", "#72b7b2", "#9d755d", "#d67195")
PANEL_H = 190  # one metric's panel, in px (its width is a share of the cell's)
MIN_PANEL_W = 280  # below this a panel moves to the next row rather than squeeze its labels
# plot area margins inside a panel: the title (and readout) row, then the legend's row, then the plot, whose
# top tick label sits below the legend (never on it); ticks and 'step' below
TOP, BOTTOM = 44, 34
LEGEND_Y = 33  # the legend's baseline: 11 px over the top tick label's (TOP + 4)
PLOT_X, PLOT_W = 17.0, 80.0  # plot area, in percent of the panel's width (y tick labels on the left)
GAP, COLUMNS = 10, 3
VIEW = 1000.0  # the plot area's own coordinates, stretched to its size (lines keep their stroke width)
HOVER_BANDS = 100  # most hover bands per panel: enough to read values, little to store
SMOOTHING = (0.0, 0.6, 0.9, 0.99)  # TensorBoard's default is 0.6
DEFAULT_SMOOTHING = 0.6
MIN_TO_SMOOTH = 8  # fewer points than this are drawn as they are
RAW_OPACITY = 0.5  # the raw line under the smoothed one: faint, yet seen on the dark theme's background too
LOG_DECADES = 2.0  # positive values spanning this many decades (100x) are drawn on a log scale
_SKIP = ("step", "rank")

_STYLE = (
    ".nbl-hit{fill:currentColor;fill-opacity:0}"
    ".nbl-rule{stroke:currentColor;stroke-opacity:.6;stroke-dasharray:3 3;pointer-events:none}"
    ".nbl-readout{fill:currentColor;font-weight:bold;pointer-events:none}"
    ".nbl-rule,.nbl-readout{visibility:hidden}.nbl-band:hover .nbl-rule,.nbl-band:hover .nbl-readout"
    "{visibility:visible}.nbl-panel:has(.nbl-band:hover) .nbl-head{visibility:hidden}"
    ".nbl-ema{display:none}.nbl-ema-6{display:inline}"
    ".nbl-smoothing label{margin-left:.6em;cursor:pointer}.nbl-smoothing input{margin:0 .2em 0 0;vertical-align:-2px}"
    + "".join(
        f'.nblaunch-chart:has(input[value="{w:g}"]:checked) .nbl-ema{{display:none}}'
        f'.nblaunch-chart:has(input[value="{w:g}"]:checked) .nbl-ema-{k}{{display:inline}}'
        for w, k in ((0.6, 6), (0.9, 9), (0.99, 99))
    )
    + '.nblaunch-chart:has(input[value="0"]:checked) .nbl-ema{display:none}'
    '.nblaunch-chart:has(input[value="0"]:checked) .nbl-raw{stroke-opacity:1}'
)


def _key(weight: float) -> str:
    return {0.6: "6", 0.9: "9", 0.99: "99"}[weight]


class MetricsChart:
    """Series by metric (and rank), filled incrementally from the run report's list of points."""

    def __init__(self):
        self.series: dict[str, dict[int | None, tuple[list[float], list[float]]]] = {}
        self.consumed = 0
        self.group = "nbl-smooth-" + secrets.token_hex(4)  # this chart's smoothing control, apart from others'

    def add(self, points) -> MetricsChart:
        for p in points:
            step, rank = p.get("step"), p.get("rank")
            for name, v in p.items():
                if name in _SKIP or isinstance(v, bool) or not isinstance(v, (int, float)):
                    continue
                xs, ys = self.series.setdefault(name, {}).setdefault(rank, ([], []))
                xs.append(float(len(xs) if step is None else step))
                ys.append(float(v))
        return self

    def render(self, points: list, *, final: bool = False) -> str:
        """The chart's markup for every point so far; only points not seen before are read (``points`` only grows).

        ``final``: the run has ended, so the chart gets its smoothing control (redrawn while the run goes on,
        a control would lose the user's choice at every update)."""
        if len(points) < self.consumed:  # a new list: start over
            self.series, self.consumed = {}, 0
        self.add(points[self.consumed :])
        self.consumed = len(points)
        return self.svg(final=final)

    def svg(self, *, final: bool = False) -> str:
        """The chart's markup: a wrapping row of panels (one SVG each), so a narrow cell gets fewer panels per row
        rather than panels cut off at its right edge."""
        curves = {n: s for n, s in self.series.items() if max(len(xs) for xs, _ in s.values()) > 1}
        singles = {n: s for n, s in self.series.items() if n not in curves}
        if not curves and not singles:
            return ""
        cols = max(1, min(COLUMNS, len(curves)))
        if len(curves) == 4:
            cols = 2  # 2 x 2 rather than 3 + 1
        smoothable = any(_smooths(ys) for s in curves.values() for _, ys in s.values())
        # each panel takes 1/cols of the row and never less than MIN_PANEL_W: below that width, the row wraps
        basis = f"calc({100 / cols:.3f}% - {GAP * (cols - 1) / cols:.2f}px)"
        parts = [
            f'<div class="nblaunch-chart" style="display: flex; flex-wrap: wrap; gap: {GAP}px; width: 100%; '
            'font: 12px var(--jp-ui-font-family, sans-serif); color: var(--jp-ui-font-color1, #222)">',
            f"<style>{_STYLE}</style>",
        ]
        if final and smoothable:
            parts.append(self._control())
        for i, (name, by_rank) in enumerate(curves.items()):
            parts.append(
                f'<svg xmlns="http://www.w3.org/2000/svg" class="nbl-panel" height="{PANEL_H}" '
                f'style="flex: 1 1 {basis}; min-width: {MIN_PANEL_W}px; overflow: visible">'
                f"{_panel(name, by_rank, COLORS[i % len(COLORS)], final)}</svg>"
            )
        if singles:
            parts.append(f'<div class="nbl-values" style="flex: 1 1 100%">{_values(singles)}</div>')
        parts.append("</div>")
        return "".join(parts)

    def _control(self) -> str:
        """Radio buttons that show one precomputed smoothing; CSS (:has) does the switching, no script."""
        options = "".join(
            f'<label><input type="radio" name="{self.group}" value="{w:g}"'
            f"{' checked' if w == DEFAULT_SMOOTHING else ''}/>{'off' if w == 0 else f'{w:g}'}</label>"
            for w in SMOOTHING
        )
        return (
            '<div class="nbl-smoothing" style="flex: 1 1 100%; line-height: 22px" '
            'title="Exponential moving average, as TensorBoard smooths">'
            f"smoothing {options}</div>"
        )


# -- one panel ------------------------------------------------------------------------------------


def _panel(name: str, by_rank: dict, color: str, final: bool) -> str:
    finite_series = {r: finite(xs, ys) for r, (xs, ys) in by_rank.items()}
    ranks = sorted(finite_series, key=lambda r: (r is None, r or 0))
    all_x = [x for xs, _ in finite_series.values() for x in xs]
    all_y = [y for _, ys in finite_series.values() for y in ys]
    count = sum(len(xs) for xs, _ in by_rank.values())
    single = len(by_rank) == 1
    last = next(iter(by_rank.values()))[1][-1]
    log = bool(all_y) and min(all_y) > 0 and math.log10(max(all_y) / min(all_y)) >= LOG_DECADES
    title = f"{html.escape(name)}: last {fmt_value(last)} ({count} points)" if single else html.escape(name)
    out = [
        '<rect x="0.5" y="0.5" width="99%" height="99%" fill="none" stroke="currentColor" stroke-opacity="0.15" '
        'rx="3"/>',
        f'<rect class="nbl-head" x="8" y="9" width="10" height="10" rx="2" fill="{color}"/>' if single else "",
        f'<text class="nbl-head" x="{24 if single else 8}" y="18" fill="currentColor" font-weight="bold">{title}'
        f"{' (log scale)' if log else ''}</text>",
    ]
    if not all_y:
        return "".join(out)
    ph = PANEL_H - TOP - BOTTOM
    x_lo, x_hi = span(min(all_x), max(all_x))
    if log:
        y_lo, y_hi = math.log10(min(all_y)), math.log10(max(all_y))
        y_lo, y_hi = (y_lo - 0.5, y_hi + 0.5) if y_hi - y_lo < 1e-12 else (y_lo, y_hi)
        y_ticks = log_ticks(y_lo, y_hi)
    else:
        y_lo, y_hi = span(min(all_y), max(all_y))
        y_ticks = nice_ticks(y_lo, y_hi)
        y_lo, y_hi = min(y_lo, y_ticks[0]), max(y_hi, y_ticks[-1])
    whole = all(x == int(x) for x in all_x)  # steps (or indices): no tick between two of them
    x_ticks = [t for t in nice_ticks(x_lo, x_hi, 5, whole=whole) if x_lo <= t <= x_hi]

    def fx(x):  # 0..1 across the plot
        return (x - x_lo) / (x_hi - x_lo)

    def fy(y):  # 0..1 up the plot
        v = math.log10(y) if log else y
        return (v - y_lo) / (y_hi - y_lo)

    plot = [
        f'<rect x="0" y="0" width="{VIEW:g}" height="{VIEW:g}" fill="none" stroke="currentColor" '
        'stroke-opacity="0.35" vector-effect="non-scaling-stroke"/>'
    ]
    y_step = (y_ticks[1] - y_ticks[0]) if len(y_ticks) > 1 else 1.0
    for t in y_ticks:
        f = (t - y_lo) / (y_hi - y_lo)
        label = fmt_log(t) if log else fmt_tick(t, y_step, max(abs(y_ticks[0]), abs(y_ticks[-1])))
        plot.append(
            f'<line x1="0" x2="{VIEW:g}" y1="{VIEW * (1 - f):.1f}" y2="{VIEW * (1 - f):.1f}" stroke="currentColor" '
            'stroke-opacity="0.12" vector-effect="non-scaling-stroke"/>'
        )
        out.append(
            f'<text x="{PLOT_X - 1.5:g}%" y="{TOP + ph * (1 - f) + 4:.1f}" text-anchor="end" '
            f'fill="currentColor">{label}</text>'
        )
    x_step = (x_ticks[1] - x_ticks[0]) if len(x_ticks) > 1 else 1.0
    x_big = max((abs(t) for t in x_ticks), default=1.0)
    for t in x_ticks:
        xp = PLOT_X + PLOT_W * fx(t)
        out.append(
            f'<line x1="{xp:.2f}%" x2="{xp:.2f}%" y1="{TOP + ph}" y2="{TOP + ph + 4}" stroke="currentColor" '
            f'stroke-opacity="0.5"/><text x="{xp:.2f}%" y="{TOP + ph + 17}" text-anchor="middle" '
            f'fill="currentColor">{fmt_tick(t, x_step, x_big, si=True)}</text>'
        )
    out.append(
        f'<text x="{PLOT_X + PLOT_W:g}%" y="{PANEL_H - 3}" text-anchor="end" fill="currentColor" '
        'fill-opacity="0.75">step</text>'
    )
    smoothed: dict = {}
    legend: list[str] = []
    for k, rank in enumerate(ranks):
        xs, ys = finite_series[rank]
        c = color if single else COLORS[k % len(COLORS)]
        smooth = _smooths(ys)  # per panel and line: a schedule without noise is drawn as it is
        plot.append(_line(xs, ys, fx, fy, c, "nbl-raw", RAW_OPACITY if smooth else 1.0))
        if smooth:
            weights = (w for w in SMOOTHING if w and (final or w == DEFAULT_SMOOTHING))
            for w in weights:
                line = ema(ys, w)
                smoothed.setdefault(rank, {})[w] = line
                plot.append(_line(xs, line, fx, fy, c, f"nbl-ema nbl-ema-{_key(w)}", 1.0))
        if xs:
            out.append(
                f'<circle cx="{PLOT_X + PLOT_W * fx(xs[-1]):.2f}%" cy="{TOP + ph * (1 - fy(ys[-1])):.1f}" r="3" '
                f'fill="{c}"/>'
            )
        if not single:
            label = f"rank {rank}" if rank is not None else "all"
            legend.append(
                f'<rect x="{k * 110}" y="{LEGEND_Y - 5}" width="10" height="3" fill="{c}"/>'
                f'<text x="{14 + k * 110}" y="{LEGEND_Y}" fill="currentColor" font-size="11">{label}: '
                f"{fmt_value(by_rank[rank][1][-1])}</text>"
            )
    if legend:  # from the plot's left edge: the y tick labels' column stays clear
        out.append(f'<svg class="nbl-head" x="{PLOT_X:g}%" y="0" overflow="visible">{"".join(legend)}</svg>')
    bands = _hover_bands(name, finite_series, ranks, smoothed, fx, ph)
    out.append(
        f'<svg x="{PLOT_X:g}%" y="{TOP}" width="{PLOT_W:g}%" height="{ph}" viewBox="0 0 {VIEW:g} {VIEW:g}" '
        f'preserveAspectRatio="none" overflow="visible">{"".join(plot)}</svg>'
    )
    out.append(bands)  # over the plot, in the panel's own units: the readout's text is not stretched
    return "".join(out)


def _smooths(ys: list[float]) -> bool:
    return len(ys) >= MIN_TO_SMOOTH and is_noisy(ys)


def _line(xs, ys, fx, fy, color: str, cls: str, opacity: float) -> str:
    coords = " ".join(f"{VIEW * fx(x):.1f},{VIEW * (1 - fy(y)):.1f}" for x, y in thin(xs, ys, 400))
    return (
        f'<polyline class="{cls}" fill="none" stroke="{color}" stroke-opacity="{opacity:g}" stroke-width="1.75" '
        f'vector-effect="non-scaling-stroke" stroke-linejoin="round" points="{coords}"/>'
    )


def _hover_bands(name: str, series: dict, ranks: list, smoothed: dict, fx, ph: float) -> str:
    """Invisible full-height bands over the plot, one per step shown: hovering one draws a rule at its step
    and writes every line's value there (raw and smoothed) at the top right of the panel, at once, by CSS alone
    (``:hover``), so it works in a stored notebook with no kernel and no script; a ``<title>`` says it too."""
    xs = sorted({x for r in ranks for x in series[r][0]})
    if not xs:
        return ""
    stride = max(1, math.ceil(len(xs) / HOVER_BANDS))
    picked = xs[::stride]
    if picked[-1] != xs[-1]:
        picked.append(xs[-1])
    index = {r: {x: i for i, x in enumerate(series[r][0])} for r in ranks}
    edges = [fx(x) for x in picked]
    out = []
    for j, x in enumerate(picked):
        left = (edges[j - 1] + edges[j]) / 2 if j else 0.0
        right = (edges[j] + edges[j + 1]) / 2 if j + 1 < len(picked) else 1.0
        values = []
        for r in ranks:
            i = index[r].get(x)
            if i is None:
                continue
            text = fmt_value(series[r][1][i])
            if DEFAULT_SMOOTHING in smoothed.get(r, {}):
                text += f" (smoothed {fmt_value(smoothed[r][DEFAULT_SMOOTHING][i])})"
            values.append(text if len(ranks) == 1 else f"rank {r}: {text}")
        tip = html.escape(f"{name} at step {fmt_value(x)}: " + ", ".join(values))
        xp = PLOT_X + PLOT_W * fx(x)
        out.append(
            f'<g class="nbl-band"><rect class="nbl-hit" x="{PLOT_X + PLOT_W * left:.2f}%" y="{TOP}" '
            f'width="{PLOT_W * max(right - left, 0.001):.2f}%" height="{ph}"><title>{tip}</title></rect>'
            f'<line class="nbl-rule" x1="{xp:.2f}%" x2="{xp:.2f}%" y1="{TOP}" y2="{TOP + ph}"/>'
            f'<text class="nbl-readout" x="8" y="18">{tip}</text></g>'
        )
    return "".join(out)


def _values(singles: dict) -> str:
    """'name value' for each metric logged once, as inline items that wrap with the cell's width."""
    items = []
    for name, by_rank in singles.items():
        for rank, (_, ys) in sorted(by_rank.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
            label = name if rank is None else f"{name}[{rank}]"
            items.append(
                f'<span style="display: inline-block; margin-right: 1.5em"><b>{html.escape(label)}</b> '
                f"{fmt_value(ys[-1])}</span>"
            )
    return "".join(items)
