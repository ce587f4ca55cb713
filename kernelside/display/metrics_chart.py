"""The live metrics chart: one small panel per metric, drawn as a self-contained SVG.

Each metric gets its own panel with its own scale (a loss of 0.01 is never flattened by a
learning-rate or an epoch counter), ticks and values on both axes, its name and latest value
in the title, and a log scale when its values are positive and span two decades (100x) or more.
With ``progress="all"`` a panel has one line per rank. A metric logged once (Trainer's
``train_runtime``, say) is a value, not a curve: it is listed in a row of latest values.

The SVG is the value of an ipywidgets HTML widget (``progress_view.RunDisplay``), so the final
chart is stored with the notebook's widget state. Long series are thinned to the pixels they
cover (minimum and maximum per pixel column), so the stored chart stays small.

Example::

    >>> chart = MetricsChart()
    >>> svg = chart.render([{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.5}])
    >>> "loss: last 1.5 (2 points)" in svg
    True
"""

from __future__ import annotations

import html
import math

COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
PANEL_W, PANEL_H = 300, 160  # one metric's panel, in px
LEFT, RIGHT, TOP, BOTTOM = 50, 12, 24, 30  # plot area margins inside a panel (room for ticks and title)
GAP, COLUMNS = 10, 3
LOG_DECADES = 2.0  # positive values spanning this many decades (100x) are drawn on a log scale
_SKIP = ("step", "rank")


class MetricsChart:
    """Series by metric (and rank), filled incrementally from the run report's list of points."""

    def __init__(self):
        self.series: dict[str, dict[int | None, tuple[list[float], list[float]]]] = {}
        self.consumed = 0

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

    def render(self, points: list) -> str:
        """The SVG for every point so far; only points not seen before are read (``points`` only grows)."""
        if len(points) < self.consumed:  # a new list: start over
            self.__init__()
        self.add(points[self.consumed :])
        self.consumed = len(points)
        return self.svg()

    def svg(self) -> str:
        curves = {n: s for n, s in self.series.items() if max(len(xs) for xs, _ in s.values()) > 1}
        singles = {n: s for n, s in self.series.items() if n not in curves}
        if not curves and not singles:
            return ""
        cols = max(1, min(COLUMNS, len(curves)))
        rows = math.ceil(len(curves) / cols)
        legend_h = 14 if any(len(s) > 1 for s in curves.values()) else 0
        panel_h = PANEL_H + legend_h
        width = cols * PANEL_W + (cols - 1) * GAP
        values_h = 18 * len(_value_rows(singles, width)) if singles else 0
        height = rows * (panel_h + GAP) + values_h
        parts = [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" style="font: 11px sans-serif; '
            'color: var(--jp-ui-font-color1, #333)">'
        ]
        for i, (name, by_rank) in enumerate(curves.items()):
            x0 = (i % cols) * (PANEL_W + GAP)
            y0 = (i // cols) * (panel_h + GAP)
            parts.append(f'<g transform="translate({x0},{y0})">')
            parts.append(_panel(name, by_rank, COLORS[i % len(COLORS)], legend_h))
            parts.append("</g>")
        for j, row in enumerate(_value_rows(singles, width)):
            parts.append(f'<text x="2" y="{rows * (panel_h + GAP) + 13 + 18 * j}" fill="currentColor">{row}</text>')
        parts.append("</svg>")
        return "".join(parts)


# -- one panel ------------------------------------------------------------------------------------


def _panel(name: str, by_rank: dict, color: str, legend_h: int) -> str:
    pw, ph = PANEL_W - LEFT - RIGHT, PANEL_H - TOP - BOTTOM
    top = TOP + legend_h
    finite = {r: _finite(xs, ys) for r, (xs, ys) in by_rank.items()}
    all_x = [x for xs, _ in finite.values() for x in xs]
    all_y = [y for _, ys in finite.values() for y in ys]
    count = sum(len(xs) for xs, _ in by_rank.values())
    single = len(by_rank) == 1
    last = next(iter(by_rank.values()))[1][-1]
    title = f"{html.escape(name)}: last {_fmt_value(last)} ({count} points)" if single else html.escape(name)
    log = bool(all_y) and min(all_y) > 0 and math.log10(max(all_y) / min(all_y)) >= LOG_DECADES
    out = [
        f'<rect x="0.5" y="0.5" width="{PANEL_W - 1}" height="{PANEL_H + legend_h - 1}" fill="none" '
        'stroke="currentColor" stroke-opacity="0.15" rx="3"/>',
        f'<text x="{LEFT}" y="15" fill="{color if single else "currentColor"}" font-weight="bold">{title}'
        f"{' (log scale)' if log else ''}</text>",
    ]
    if not all_y:
        return "".join(out)
    x_lo, x_hi = _span(min(all_x), max(all_x))
    if log:
        y_lo, y_hi = math.log10(min(all_y)), math.log10(max(all_y))
        y_lo, y_hi = (y_lo - 0.5, y_hi + 0.5) if y_hi - y_lo < 1e-12 else (y_lo, y_hi)
        y_ticks = _log_ticks(y_lo, y_hi)
    else:
        y_lo, y_hi = _span(min(all_y), max(all_y))
        y_ticks = _nice_ticks(y_lo, y_hi)
        y_lo, y_hi = min(y_lo, y_ticks[0]), max(y_hi, y_ticks[-1])
    whole = all(x == int(x) for x in all_x)  # steps (or indices): no tick between two of them
    x_ticks = [t for t in _nice_ticks(x_lo, x_hi, 5, whole=whole) if x_lo <= t <= x_hi]

    def px(x):
        return LEFT + (x - x_lo) / (x_hi - x_lo) * pw

    def py(y):
        v = math.log10(y) if log else y
        return top + ph - (v - y_lo) / (y_hi - y_lo) * ph

    out.append(
        f'<rect x="{LEFT}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="currentColor" '
        'stroke-opacity="0.35"/>'
    )
    y_step = (y_ticks[1] - y_ticks[0]) if len(y_ticks) > 1 else 1.0
    for t in y_ticks:
        yy = top + ph - (t - y_lo) / (y_hi - y_lo) * ph
        label = _fmt_log(t) if log else _fmt_tick(t, y_step, max(abs(y_ticks[0]), abs(y_ticks[-1])))
        out.append(
            f'<line x1="{LEFT}" x2="{LEFT + pw}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="currentColor" '
            f'stroke-opacity="0.12"/><text x="{LEFT - 4}" y="{yy + 3.5:.1f}" text-anchor="end" '
            f'fill="currentColor" font-size="10">{label}</text>'
        )
    x_step = (x_ticks[1] - x_ticks[0]) if len(x_ticks) > 1 else 1.0
    x_big = max((abs(t) for t in x_ticks), default=1.0)
    for t in x_ticks:
        xx = px(t)
        out.append(
            f'<line x1="{xx:.1f}" x2="{xx:.1f}" y1="{top + ph}" y2="{top + ph + 4}" stroke="currentColor" '
            f'stroke-opacity="0.5"/><text x="{xx:.1f}" y="{top + ph + 15}" text-anchor="middle" '
            f'fill="currentColor" font-size="10">{_fmt_tick(t, x_step, x_big, si=True)}</text>'
        )
    out.append(
        f'<text x="{LEFT + pw}" y="{top + ph + 27}" text-anchor="end" fill="currentColor" '
        'fill-opacity="0.7" font-size="10">step</text>'
    )
    for k, (rank, (xs, ys)) in enumerate(sorted(finite.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))):
        c = color if single else COLORS[k % len(COLORS)]
        pts = _thin(xs, ys, pw)
        coords = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
        out.append(f'<polyline fill="none" stroke="{c}" stroke-width="1.5" points="{coords}"/>')
        if pts:
            out.append(f'<circle cx="{px(pts[-1][0]):.1f}" cy="{py(pts[-1][1]):.1f}" r="2.5" fill="{c}"/>')
        if not single:
            label = f"rank {rank}" if rank is not None else "all"
            out.append(
                f'<text x="{LEFT + k * 95}" y="{TOP + 6}" fill="{c}" font-size="10">{label}: '
                f"{_fmt_value(by_rank[rank][1][-1])}</text>"
            )
    return "".join(out)


def _value_rows(singles: dict, width: int) -> list[str]:
    """'name value' for each metric logged once, wrapped into rows that fit the chart's width."""
    items = []
    for name, by_rank in singles.items():
        for rank, (_, ys) in sorted(by_rank.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
            label = name if rank is None else f"{name}[{rank}]"
            value = _fmt_value(ys[-1])
            markup = f'<tspan font-weight="bold">{html.escape(label)}</tspan> {value}'
            items.append((markup, 6.2 * (len(label) + len(value) + 4)))
    rows, row, used = [], [], 0.0
    for markup, w in items:
        if row and used + w > width:
            rows.append("   ".join(row))
            row, used = [], 0.0
        row.append(markup)
        used += w
    if row:
        rows.append("   ".join(row))
    return rows


# -- numbers --------------------------------------------------------------------------------------


def _finite(xs, ys):
    pairs = [(x, y) for x, y in zip(xs, ys, strict=True) if math.isfinite(y) and math.isfinite(x)]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _span(lo: float, hi: float) -> tuple[float, float]:
    if hi - lo > 1e-12 * max(1.0, abs(hi)):
        return lo, hi
    pad = abs(lo) * 0.1 or 1.0  # a constant series: a band around its value
    return lo - pad, hi + pad


def _nice_ticks(lo: float, hi: float, n: int = 4, whole: bool = False) -> list[float]:
    """Round tick values (1, 2, 2.5 or 5 times a power of ten) covering [lo, hi]; whole numbers if ``whole``."""
    raw = (hi - lo) / max(1, n)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    if whole:
        step = max(1.0, round(step) if step != 2.5 else 2.0)
    first = math.floor(lo / step) * step
    ticks, t = [], first
    while t <= hi + step * 0.5 and len(ticks) < 12:
        ticks.append(round(t / step) * step)
        t += step
    return [t for t in ticks if t >= lo - step * 0.5]


def _log_ticks(lo: float, hi: float) -> list[float]:
    """log10 positions of 10^k in range, with 2x and 5x added when fewer than three decades show."""
    ticks = [float(k) for k in range(math.ceil(lo), math.floor(hi) + 1)]
    if len(ticks) < 3:
        extra = [k + math.log10(m) for k in range(math.floor(lo), math.ceil(hi) + 1) for m in (2, 5)]
        ticks = sorted(set(ticks) | {t for t in extra if lo <= t <= hi})
    return ticks or [lo, hi]


def _fmt_value(v: float) -> str:
    """A latest value: four significant digits, whole numbers up to 1e7, exponents without '+' and padding."""
    if 1e4 <= abs(v) < 1e7:
        return f"{v:.0f}"
    return _trim_exponent(f"{v:.4g}")


def _trim_exponent(text: str) -> str:
    if "e" not in text:
        return text
    mantissa, exp = text.split("e")
    if "." in mantissa:
        mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{mantissa}e{int(exp)}"


def _fmt_log(t: float) -> str:
    v = 10**t
    return _trim_exponent(f"{v:.1e}") if abs(t) >= 3 else f"{v:g}"


def _fmt_tick(v: float, step: float, biggest: float, si: bool = False) -> str:
    """A tick label, formatted for its axis (``step`` apart, ``biggest`` in magnitude) so labels stay distinct."""
    if abs(v) < step * 1e-9:
        return "0"
    if si and biggest >= 1e4:
        div, suffix = next((d, s) for d, s in ((1e9, "G"), (1e6, "M"), (1e3, "k")) if biggest >= d * 10)
        return f"{v / div:.{_decimals(step / div)}f}{suffix}"
    if biggest >= 1e7 or biggest < 1e-2:  # each value with its own exponent, as precise as the step needs
        e, step_e = math.floor(math.log10(abs(v))), math.floor(math.log10(step))
        digits = max(0, e - step_e) + _decimals(step / 10**step_e)
        return _trim_exponent(f"{v:.{digits}e}")
    return f"{v:.{_decimals(step)}f}"


def _decimals(step: float) -> int:
    """The fewest decimals that show ticks ``step`` apart exactly (0.25 -> 2, 5 -> 0)."""
    for d in range(9):
        scaled = step * 10**d
        if abs(scaled - round(scaled)) < 1e-6 * max(1.0, scaled):
            return d
    return 8


def _thin(xs: list[float], ys: list[float], pixels: int) -> list[tuple[float, float]]:
    """At most about two points per pixel column (the minimum and maximum, in order), ends kept."""
    n = len(xs)
    if n <= 2 * pixels:
        return list(zip(xs, ys, strict=True))
    lo, hi = xs[0], xs[-1]
    width = (hi - lo) / pixels or 1.0
    out, bucket, current = [(xs[0], ys[0])], [], None
    for x, y in zip(xs[1:-1], ys[1:-1], strict=True):
        b = int((x - lo) / width)
        if b != current and bucket:
            out.extend(_extremes(bucket))
            bucket = []
        current = b
        bucket.append((x, y))
    if bucket:
        out.extend(_extremes(bucket))
    out.append((xs[-1], ys[-1]))
    return out


def _extremes(bucket):
    lo = min(bucket, key=lambda p: p[1])
    hi = max(bucket, key=lambda p: p[1])
    return sorted({lo, hi}, key=lambda p: p[0]) if lo != hi else [lo]
