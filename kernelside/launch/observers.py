"""What watches a run besides the recorder, registered with the runner.

The recorder decides (rank states, the outcome, the root cause); everything else only watches: the
cell's widgets, the Runs view's state file, the GPU sampler, a caller's ``on_event`` hook, a live
request's own bookkeeping. ``run_engine`` registers each of them here before the run starts; the
recorder passes every event on once it has taken it, the runner ticks them once per turn of its
loop, and they are told the run's end. No observer can change what the recorder decided.

Example::

    >>> seen = []
    >>> obs = RunObservers()
    >>> obs.watch(lambda rank, kind, payload: seen.append((rank, kind)), kinds=("progress",))
    >>> obs.event(1, "progress", {}); obs.event(1, "ready", {})
    >>> seen
    [(1, 'progress')]
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

EventHook = Callable[[int, str, object], None]


class RunObservers:
    """The run's watchers: event hooks (each for the event kinds it names, or all), tick hooks and end hooks."""

    def __init__(self) -> None:
        self._watchers: list[tuple[frozenset[str] | None, EventHook]] = []
        self._tickers: list[Callable[[], None]] = []
        self._finishers: list[Callable[[BaseException | None], None]] = []
        self.display = None  # the cell's widgets (status line, bars, chart) when the run draws them
        self.control = None  # the Runs view's Stop and stacks channel (run_tracker), served by an engine's loop

    def watch(self, hook: EventHook, kinds: Iterable[str] | None = None) -> None:
        """Call ``hook(rank, kind, payload)`` for each event of ``kinds`` (None: every event)."""
        self._watchers.append((None if kinds is None else frozenset(kinds), hook))

    def on_tick(self, hook: Callable[[], None]) -> None:
        """Call ``hook()`` once per turn of the runner's loop (partial lines, throttled redraws, samples)."""
        self._tickers.append(hook)

    def on_finish(self, hook: Callable[[BaseException | None], None]) -> None:
        """Call ``hook(error)`` once the run's outcome is known (None: it succeeded)."""
        self._finishers.append(hook)

    def event(self, rank: int, kind: str, payload) -> None:
        for kinds, hook in self._watchers:
            if kinds is None or kind in kinds:
                hook(rank, kind, payload)

    def tick(self) -> None:
        for hook in self._tickers:
            hook()

    def finish(self, error: BaseException | None) -> None:
        for hook in self._finishers:
            hook(error)
