"""A run's training curves and each rank's pace, appended to its run folder for the Runs dashboard.

The cell's chart draws the metrics the kernel receives; the dashboard, in another process (the Jupyter
server), draws the same curves from ``series.jsonl`` (``run_contract.SERIES_FILE``), which this writer
appends to as the events arrive: every metrics batch, and each progress bar's count at most every
``SERIES_PROGRESS_EVERY_S`` (its last state always), so the dashboard can tell each rank's steps per
second. Times are the kernel's wall clock when the event arrived, the clock the server samples the
ranks' CPU and memory by, so both share one time axis.

The file is made by descriptor in the run's own folder (``private_dir.open_in``, 0600) and opened for
each write (a few a second at most), so nothing stays open after the run; it stops at
``SERIES_MAX_BYTES``. A write that fails (a full disk) loses that line, never the launch.

Example::

    >>> series = RunSeries(run_dir)                        # doctest: +SKIP
    >>> series.event(0, "metrics", [{"step": 1, "loss": 2.5}])
"""

from __future__ import annotations

import json
import math
import os
import time

from ..private_dir import open_in
from ..run_contract import SERIES_FILE, SERIES_MAX_BYTES, SERIES_PROGRESS_EVERY_S


class RunSeries:
    """Appends one run's metrics and progress events to its ``series.jsonl``; see the module docstring."""

    def __init__(self, run_dir: str, max_bytes: int = SERIES_MAX_BYTES):
        self.run_dir = run_dir
        self.max_bytes = max_bytes
        self.written = 0
        self.full = False
        self._last_bar: dict[tuple[int, object], float] = {}  # (rank, bar id) -> when its count was written

    def event(self, rank: int, kind: str, payload) -> None:
        """A worker's ``metrics``, ``progress`` or ``pace`` event (others are ignored)."""
        now = time.time()
        if kind == "metrics" and isinstance(payload, list):
            points = [_plain_point(p) for p in payload if isinstance(p, dict)]
            if points:
                self._append({"kind": "metrics", "rank": rank, "wall": now, "points": points})
        elif kind in ("progress", "pace") and isinstance(payload, dict):  # pace: a bar the cell does not show
            key = (rank, payload.get("id"))
            closed = bool(payload.get("closed"))
            if not closed and now - self._last_bar.get(key, -math.inf) < SERIES_PROGRESS_EVERY_S:
                return
            self._last_bar[key] = now
            line = {k: payload.get(k) for k in ("desc", "n", "total", "unit")}
            self._append({"kind": "progress", "rank": rank, "wall": now, "bar": payload.get("id"), **line})

    def _append(self, record: dict) -> None:
        if self.full:
            return
        data = (json.dumps(record, default=repr, allow_nan=False) + "\n").encode()
        if self.written + len(data) > self.max_bytes:
            self.full = True
            data = json.dumps({"kind": "full", "wall": record["wall"], "max_bytes": self.max_bytes}).encode() + b"\n"
        try:
            fd = open_in(self.run_dir, SERIES_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        except OSError:
            return  # the run folder is gone (pruned, removed): the dashboard shows what it has
        try:
            os.write(fd, data)
            self.written += len(data)
        except OSError:
            pass  # a full disk: this line is lost, the launch goes on
        finally:
            os.close(fd)


def _plain_point(point: dict) -> dict:
    """The point as JSON can hold it: a NaN or infinite value is None (a gap in its line), a tensor's float
    its number; a value that is no number or text is left out."""
    plain = {}
    for name, value in point.items():
        if value is None or isinstance(value, (bool, int, str)):
            plain[str(name)] = value
            continue
        try:
            number = float(value)
        except (TypeError, ValueError, RuntimeError, OverflowError):  # (a tensor of many values)
            continue
        plain[str(name)] = number if math.isfinite(number) else None
    return plain
