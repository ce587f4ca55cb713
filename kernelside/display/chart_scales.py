"""The numbers behind the metrics chart (``metrics_chart.py``): round ticks on linear and log axes, tick and value
labels that stay distinct, series thinned to the pixels they cover, and the exponential moving average that
TensorBoard users smooth with.

Example::

    >>> nice_ticks(0.0, 1.0)
    [0.0, 0.25, 0.5, 0.75, 1.0]
    >>> [round(v, 3) for v in ema([1.0, 0.0, 0.0], 0.5)]
    [1.0, 0.333, 0.143]
"""

from __future__ import annotations

import math


def ema(ys: list[float], weight: float) -> list[float]:
    """TensorBoard's smoothing: an exponential moving average with its start-up bias removed (so the first
    points are not pulled towards 0). ``weight`` 0 is the raw series."""
    out, avg = [], 0.0
    for i, y in enumerate(ys, 1):
        avg = weight * avg + (1 - weight) * y
        out.append(avg / (1 - weight**i) if weight else y)
    return out


def is_noisy(ys: list[float], share: float = 0.1) -> bool:
    """Whether smoothing helps: the series turns back on itself (its steps change sign) at more than ``share``
    of its points, as a loss does. A schedule (a constant or warm-up-then-cosine learning rate, a step decay)
    turns a few times at most: smoothing would only bend it.

    Example::

        >>> is_noisy([1.0, 0.5, 0.9, 0.4, 0.8, 0.3, 0.7, 0.2]), is_noisy([0.1 * i for i in range(8)])
        (True, False)
    """
    steps = [b - a for a, b in zip(ys, ys[1:], strict=False) if b != a]
    turns = sum(1 for a, b in zip(steps, steps[1:], strict=False) if (a > 0) != (b > 0))
    return turns > share * len(ys)


def finite(xs, ys):
    pairs = [(x, y) for x, y in zip(xs, ys, strict=True) if math.isfinite(y) and math.isfinite(x)]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def span(lo: float, hi: float) -> tuple[float, float]:
    if hi - lo > 1e-12 * max(1.0, abs(hi)):
        return lo, hi
    pad = abs(lo) * 0.1 or 1.0  # a constant series: a band around its value
    return lo - pad, hi + pad


def nice_ticks(lo: float, hi: float, n: int = 4, whole: bool = False) -> list[float]:
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


def log_ticks(lo: float, hi: float) -> list[float]:
    """log10 positions of 10^k in range, with 2x and 5x added when fewer than three decades show."""
    ticks = [float(k) for k in range(math.ceil(lo), math.floor(hi) + 1)]
    if len(ticks) < 3:
        extra = [k + math.log10(m) for k in range(math.floor(lo), math.ceil(hi) + 1) for m in (2, 5)]
        ticks = sorted(set(ticks) | {t for t in extra if lo <= t <= hi})
    return ticks or [lo, hi]


def fmt_value(v: float) -> str:
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


def fmt_log(t: float) -> str:
    v = 10**t
    return _trim_exponent(f"{v:.1e}") if abs(t) >= 3 else f"{v:g}"


def fmt_tick(v: float, step: float, biggest: float, si: bool = False) -> str:
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


def thin(xs: list[float], ys: list[float], pixels: int) -> list[tuple[float, float]]:
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
