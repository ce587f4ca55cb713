"""A live cell's run display, drawn only once it has something to show.

A live cell such as ``x = 1`` is over in a few milliseconds: opening the status line, the bars box
and the chart (ten widget comms, a display message and their first updates) would cost it more than
the cell itself, for a line nobody can read before it is replaced. ``DeferredRunDisplay`` stands in
for ``progress_view.RunDisplay`` and makes the real one at the first progress bar or metrics point,
or once the cell has run ``SHOW_AFTER_S`` (a long cell shows its status line, elapsed time and log
links as before). A cell that ends sooner shows only what it printed, returned or raised.

Example::

    >>> d = deferred_run_display(report, "rank0", "rank0")   # doctest: +SKIP
    >>> d.show(); d.tick()      # nothing drawn yet; a progress event or SHOW_AFTER_S draws it
"""

from __future__ import annotations

import time

from ..run_contract import RunState
from .progress_view import make_run_display, render_mode

SHOW_AFTER_S = 1.0


class DeferredRunDisplay:
    """The ``RunDisplay`` interface (show, on_event, tick, finish); the real display is made on first need."""

    def __init__(self, report, output: str, scope: str):
        self.report, self.output, self.scope = report, output, scope
        self.real = None
        self.wanted = False
        self.t0 = time.monotonic()

    def hold(self, widget) -> bool:
        """The rank tabs are shown apart from a live cell's display (which may never be drawn)."""
        return False

    def show(self) -> None:
        self.wanted = True  # the run has started: draw once there is something to see

    def _draw(self):
        if self.real is None:
            self.real = make_run_display(self.report, self.output, self.scope)
            self.real.t0 = self.t0  # elapsed time counts from the cell's start, not from the first bar
            self.real.show()
        return self.real

    def on_event(self, rank: int, kind: str, payload) -> None:
        self._draw().on_event(rank, kind, payload)

    def tick(self, force: bool = False) -> None:
        # only a cell still at work earns its status line: once the outcome is decided (a rank failed, a stop),
        # the cell's error says the rest, however long the ranks take to come back to idle
        running = self.report.state is RunState.RUNNING
        if self.real is None and self.wanted and running and time.monotonic() - self.t0 >= SHOW_AFTER_S:
            self._draw()
        if self.real is not None:
            self.real.tick(force)

    def finish(self, error: BaseException | None) -> None:
        if self.real is not None:
            self.real.finish(error)

    def session_ended(self, text: str) -> None:
        self._draw().session_ended(text)  # a live session's end is worth a line even where nothing was drawn yet


def deferred_run_display(report, output: str, scope: str) -> DeferredRunDisplay | None:
    """A DeferredRunDisplay where widgets can render, else None (as ``make_run_display``)."""
    if render_mode(output) != "widgets":
        return None
    return DeferredRunDisplay(report, output, scope)
