"""A run's training curves and each rank's pace, read from the ``series.jsonl`` its kernel appends to
(``kernelside/launch/run_series.py``; the format is ``run_contract.SERIES_FILE``'s), for the dashboard.

The file only grows, so each run's reading is kept between requests and only what was appended since is
read (at most ``READ_CHUNK`` a request; a dashboard polling once a second catches up on a long run in a
few polls). What is kept is bounded: the last ``MAX_POINTS`` metrics points of a run, the last
``MAX_PACE`` counts of each progress bar, ``MAX_RUNS`` runs (the one asked about longest ago forgotten
first). A line that is not JSON (a kernel killed mid-write) is skipped, never an error.

Example::

    >>> curves = RunCurves()
    >>> with RunDir.open(path) as d:                      # doctest: +SKIP
    ...     curves.read(d, "run-20250101-120000-ab12cd34")["metrics"][:1]
    [{'step': 1, 'loss': 2.5}]
"""

from __future__ import annotations

import json
from collections import OrderedDict, deque

from kernelside.run_contract import SERIES_FILE

from .run_files import RunDir, RunFileError

MAX_POINTS = 20000
MAX_PACE = 1200  # a bar's counts, two a second: ten minutes of pace
MAX_RUNS = 32
READ_CHUNK = 4 << 20


class _Reading:
    def __init__(self, inode: int):
        self.inode = inode
        self.offset = 0
        self.metrics: deque = deque(maxlen=MAX_POINTS)
        self.bars: dict[tuple[int, str], dict] = {}  # (rank, bar id) -> {"rank", "bar", "desc", ..., "pace"}
        self.full = False

    def take(self, record: dict) -> None:
        kind, rank = record.get("kind"), record.get("rank")
        if kind == "full":
            self.full = True
            return
        if not isinstance(rank, int) or isinstance(rank, bool) or not isinstance(record.get("wall"), (int, float)):
            return
        if kind == "metrics" and isinstance(record.get("points"), list):
            for point in record["points"]:
                if isinstance(point, dict):
                    self.metrics.append({**point, "wall": record["wall"], "from_rank": rank})
        elif kind == "progress" and isinstance(record.get("n"), (int, float)):
            key = (rank, str(record.get("bar")))
            bar = self.bars.get(key)
            if bar is None:
                bar = self.bars[key] = {"rank": rank, "bar": key[1], "pace": deque(maxlen=MAX_PACE)}
            bar.update(desc=_text(record.get("desc")), total=record.get("total"), unit=_text(record.get("unit")))
            bar["pace"].append([record["wall"], record["n"]])

    def answer(self) -> dict:
        bars = [{**bar, "pace": list(bar["pace"])} for _, bar in sorted(self.bars.items())]
        return {"metrics": list(self.metrics), "bars": bars, "full": self.full}


class RunCurves:
    """Each run's ``series.jsonl`` read so far; see the module docstring."""

    def __init__(self):
        self._runs: OrderedDict[str, _Reading] = OrderedDict()

    def read(self, d: RunDir, run_id: str) -> dict:
        """``{"metrics": [point + "wall", "from_rank"], "bars": [{"rank", "bar", "desc", "total", "unit",
        "pace": [[wall, n], ...]}], "full"}``: what the run's kernel has written so far (empty lists if nothing)."""
        reading = self._runs.get(run_id)
        try:
            data, inode = d.read_from(SERIES_FILE, reading.offset if reading else 0, READ_CHUNK)
        except RunFileError as e:
            if e.status == 404:
                return _Reading(0).answer()  # no curves (yet): a run without metrics or bars
            raise
        if reading is None or reading.inode != inode:
            if reading is not None:  # another file under the name: read it from its start
                data, inode = d.read_from(SERIES_FILE, 0, READ_CHUNK)
            reading = self._runs[run_id] = _Reading(inode)
            while len(self._runs) > MAX_RUNS:
                self._runs.popitem(last=False)
        self._runs.move_to_end(run_id)
        complete = data.rfind(b"\n") + 1  # a line still being written is read whole next time
        if complete == 0 and len(data) >= READ_CHUNK:
            complete = len(data)  # one line longer than a chunk: skipped (its rest fails to parse next time)
        for line in data[:complete].splitlines():
            try:
                record = json.loads(line)
            except (ValueError, UnicodeDecodeError, RecursionError):
                continue
            if isinstance(record, dict):
                reading.take(record)
        reading.offset += complete
        return reading.answer()


def _text(value) -> str:
    return value if isinstance(value, str) else ""
