"""Progress bars and metrics from inside workers, drawn by the kernel.

A worker cannot draw widgets (Jupyter ignores messages from processes other than the
kernel), so ``progress()`` keeps tqdm's counting and throttling and, instead of drawing,
sends the bar's state over the worker's event channel at most ``mininterval`` apart.
The kernel turns those events into ipywidgets (``progress_view.py``).

Inside a worker, the tqdm classes themselves (``tqdm.tqdm``, ``tqdm.auto.tqdm``,
``tqdm.notebook.tqdm``) are replaced by the same event-sending bar, so code that already
uses tqdm — directly or through Accelerate, transformers or Lightning — shows rank 0's
bars in the cell instead of N garbled text bars.

Where the kernel cannot draw widgets (a terminal, no ipywidgets, ``output="none"``, another
engine's workers) the bars are tqdm's text bars on stderr; outside any launch ``progress()`` is
``tqdm.auto``. The mode comes from the rank's ``WorkerContext`` (``progress_render``).

Example::

    from kernelside import progress, log_metrics
    for epoch in progress(range(3), desc="epoch"):
        for x, y in progress(loader, desc="train", leave=False):
            ...
            log_metrics(step=step, loss=loss.item())
"""

from __future__ import annotations

import itertools
import sys
import time

from tqdm import std as _tqdm_std

from . import tqdm_holders
from .context import current as _worker

# Global on purpose: a rank is one process running one launch; bars opened anywhere in it (nested
# loops, libraries' own tqdm) share one id sequence and one stack for their nesting.
_bar_ids = itertools.count()
_open_bars: list = []
PACE_EVERY_S = 0.5  # a hidden rank's bar tells its count this often (SERIES_PROGRESS_EVERY_S, where it is written)


class EventTqdm(_tqdm_std.tqdm):
    """A tqdm whose display is an event to the kernel. Counting, rates and throttling are tqdm's."""

    def __init__(self, *args, **kwargs):
        ctx = _worker()
        kwargs = dict(kwargs)
        kwargs.setdefault("mininterval", 0.1)
        # A rank whose bars the cell does not show still counts, and tells only its pace (the Runs dashboard's
        # steps per second, where the slowest rank is named): a "pace" event at most every PACE_EVERY_S.
        self._hidden = ctx is not None and not ctx.shows_bars()
        if ctx is None:
            kwargs["disable"] = True
        kwargs["disable"] = bool(kwargs.get("disable", False))
        kwargs["gui"] = True  # tqdm then never writes to a file itself
        kwargs.pop("display", None)  # tqdm.notebook's extra argument
        kwargs.pop("colour", None)
        self._events = ctx.events if ctx is not None else None
        self._bar_id = next(_bar_ids)
        self._last_sent = 0.0
        self._depth = len(_open_bars)
        super().__init__(*args, **kwargs)
        if self.disable:
            return
        _open_bars.append(self)
        self.display(force=True)

    def display(self, msg=None, pos=None, *, force=False, closed=False, **_):
        if self._events is None or getattr(self, "disable", True) and not closed:
            return True
        now = time.monotonic()
        if not force and now - self._last_sent < self.mininterval:
            return True  # set_postfix / refresh every iteration must not flood the kernel
        if self._hidden:
            return self._send_pace(now, closed)
        self._last_sent = now
        d = self.format_dict
        self._events.send(
            "progress",
            {
                "id": self._bar_id,
                "depth": self._depth,
                "desc": d.get("prefix") or "",
                "n": d["n"],
                "total": d["total"],
                "elapsed": d["elapsed"],
                "rate": d["rate"],
                "unit": d["unit"],
                "postfix": d.get("postfix") or "",
                "leave": bool(self.leave),
                "closed": closed,
                "unit_scale": d.get("unit_scale"),
                "t": now,
            },
        )
        return True

    def _send_pace(self, now: float, closed: bool) -> bool:
        if not closed and now - self._last_sent < PACE_EVERY_S:
            return True
        self._last_sent = now
        d = self.format_dict
        pace = {"id": self._bar_id, "desc": d.get("prefix") or "", "n": d["n"], "total": d["total"]}
        self._events.send("pace", {**pace, "unit": d["unit"], "closed": closed, "t": now})
        return True

    def close(self):
        if self.disable:
            return
        # tqdm's close() ends with a display that, in gui mode, draws nothing: send the exact final state.
        self._ema_dt = lambda: None
        super().close()
        if self in _open_bars:
            _open_bars.remove(self)
        self.display(force=True, closed=True)

    def clear(self, *_, **__):
        pass


def progress(iterable=None, desc=None, total=None, leave=True, unit="it", disable=False, postfix=None, **kwargs):
    """A progress bar over ``iterable`` (the familiar tqdm subset), shown in the cell from a worker.

    Supports ``total``, ``desc``, ``leave``, ``unit``, ``disable``, ``postfix`` / ``set_postfix``,
    ``update(n)``, ``close()`` and use as a context manager. Outside any launch it is
    ``tqdm.auto.tqdm``.

    Example::

        >>> for batch in progress(loader, desc="train"):   # doctest: +SKIP
        ...     ...
    """
    ctx = _worker()
    kwargs.update(desc=desc, total=total, leave=leave, unit=unit, disable=disable, postfix=postfix)
    if ctx is None:
        from tqdm.auto import tqdm as auto

        return auto(iterable, **kwargs)
    mode = ctx.progress_render
    if mode == "widgets":
        return EventTqdm(iterable, **kwargs)
    if mode == "off" or not ctx.shows_bars():
        kwargs["disable"] = True
    return _tqdm_std.tqdm(iterable, file=sys.stderr, **kwargs)


class _MetricsBuffer:
    """Points logged since the last flush, and when that was (monotonic)."""

    def __init__(self):
        self.points: list[dict] = []
        self.last_flush = 0.0


# Global on purpose: log_metrics() and the captured loggers are called from anywhere in the rank's
# code, with no launch object at hand; one buffer per rank process throttles them together.
METRICS = _MetricsBuffer()
METRICS_FLUSH_S = 0.1


def log_metrics(step=None, **values):
    """Record metrics (``loss=0.3, lr=1e-3``) at ``step``: drawn live as a chart, kept in the run report.

    On rank 0 only (every rank with ``progress="all"``); a no-op outside a launch.

    Example::

        >>> log_metrics(step=10, loss=0.25)   # doctest: +SKIP
    """
    ctx = _worker()
    if ctx is None or not ctx.shows_bars():
        return
    point = {"step": step, **{k: float(v) if hasattr(v, "__float__") else v for k, v in values.items()}}
    if ctx.progress_scope == "all":
        point["rank"] = ctx.rank
    record_point(point)


def record_point(point: dict) -> None:
    """Buffer one metrics point (``{"step": ..., name: value}``) and send the buffer at most every
    METRICS_FLUSH_S: ``log_metrics()`` and the frameworks' captured loggers (metric_capture.py) both
    record through here."""
    METRICS.points.append(point)
    now = time.monotonic()
    if now - METRICS.last_flush >= METRICS_FLUSH_S:
        flush_metrics(now)


def flush_metrics(now: float | None = None) -> None:
    """Send buffered metrics now (the worker calls this before it ends, so the last point is never lost)."""
    ctx = _worker()
    if ctx is None or not METRICS.points:
        return
    batch = list(METRICS.points)
    METRICS.points.clear()
    METRICS.last_flush = time.monotonic() if now is None else now
    ctx.events.send("metrics", batch)


def finish_in_worker() -> None:
    """At the end of the launched code: final state of bars left open, and every metrics point."""
    for bar in reversed(list(_open_bars)):
        bar.close()
    flush_metrics()


def install_in_worker() -> None:
    """Make every tqdm class in this worker the event-sending bar (widgets mode only)."""
    ctx = _worker()
    if ctx is None or ctx.progress_render != "widgets":
        return
    originals, notebook_bar = tqdm_holders.tqdm_classes(exclude=EventTqdm)
    # Libraries that ran ``from tqdm.auto import tqdm`` before the fork hold the class in their
    # own globals: rebind those too (found by the parent before it forked, see tqdm_holders).
    for d, name in tqdm_holders.HOLDERS.find(originals, notebook_bar, skip=__name__):
        value = d.get(name)
        if value is EventTqdm or not tqdm_holders.holds(value, originals, notebook_bar):
            continue  # (what a module held when the parent looked, gone since)
        if id(value) in originals:
            d[name] = EventTqdm
        else:
            # a library's own bar class made in the kernel on top of the notebook bar (Lightning's
            # Tqdm): it would draw ipywidgets from the rank; it becomes the event-sending bar's subclass
            value.__bases__ = tuple(EventTqdm if id(b) in originals else b for b in value.__bases__)
