"""Each run's ranks' resource use over time, for the Runs dashboard's charts.

The server keeps the history, not the browser: a dashboard tab opened (or reopened, or the page
reloaded) mid-run still shows the run so far, and two tabs on one run draw the same lines. A sample is
taken when a client asks for a live run (``RunFolders.run``, about once a second while a dashboard or
the sidebar watches it), so the history holds what was watched; it is bounded per run
(``MAX_SAMPLES``, 20 minutes at one a second, the oldest dropped) and in runs (``MAX_RUNS``, the run
asked about longest ago forgotten first), so a long-lived server never grows with it.

Example::

    >>> history = RankHistory()
    >>> history.add("run-20250101-120000-ab12cd34", 10.0, [{"rank": 0, "cpu_percent": 97.0, "rss_bytes": 1 << 28}])
    >>> history.series("run-20250101-120000-ab12cd34")["t"]
    [10.0]
"""

from __future__ import annotations

from collections import OrderedDict, deque

MAX_SAMPLES = 1200
MAX_RUNS = 32
FIGURES = ("cpu_percent", "rss_bytes", "gpu_memory_bytes", "gpu_util_percent")


class RankHistory:
    """Bounded per-run ring buffers of ``(time, {rank: {figure: value}})`` samples."""

    def __init__(self, max_samples: int = MAX_SAMPLES, max_runs: int = MAX_RUNS):
        self.max_samples = max_samples
        self.max_runs = max_runs
        self._runs: OrderedDict[str, deque] = OrderedDict()

    def add(self, run_id: str, t: float, ranks: list[dict]) -> None:
        """Record the figures ``ranks`` carry now (a rank without figures is recorded as having none)."""
        samples = self._runs.get(run_id)
        if samples is None:
            samples = self._runs[run_id] = deque(maxlen=self.max_samples)
            while len(self._runs) > self.max_runs:
                self._runs.popitem(last=False)
        self._runs.move_to_end(run_id)
        figures = {r["rank"]: {k: r.get(k) for k in FIGURES} for r in ranks if isinstance(r.get("rank"), int)}
        samples.append((t, figures))

    def series(self, run_id: str) -> dict:
        """``{"t": [wall seconds], "ranks": {rank: {figure: [value or None, ...]}}}``, oldest first.

        Every list has one entry per time; a figure a rank lacked at a time is None there (a gap).
        """
        samples = self._runs.get(run_id) or ()
        ranks = sorted({rank for _, figures in samples for rank in figures})
        return {
            "t": [t for t, _ in samples],
            "ranks": {
                str(rank): {k: [figures.get(rank, {}).get(k) for _, figures in samples] for k in FIGURES}
                for rank in ranks
            },
        }
