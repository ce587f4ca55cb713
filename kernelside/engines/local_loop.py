"""The kernel loop of a local launch: every rank's pipes (each rank's own ordered reader,
``engines.rank_reader``) and exit notifications, multiplexed in the calling thread (the kernel's
main thread, so Ctrl-C lands here).

It only observes: bytes go to the recorder as output, events as events, process exits as exits.
The recorder decides what they mean and, at the first failure, asks the engine to stop (SIGTERM
to every rank); ``launch.runner.run_engine`` decides how long to keep polling (the deadline, the
grace), and the engine's ``close()`` does the rest.

Example::

    >>> loop = EventLoop(group, recorder)              # doctest: +SKIP
    >>> while not loop.poll(0.1): pass
    >>> loop.finish()
"""

from __future__ import annotations

import selectors

from .. import interrupts
from ..channel import EventReader
from ..run_contract import stopped_message
from .local_bridge import EVENT_KINDS, NotebookBridge
from .rank_reader import RankReader


class EventLoop:
    """The kernel loop: pipes and exits of every rank, multiplexed in the calling thread."""

    def __init__(self, group, recorder, *, until=None, readers: list[EventReader] | None = None):
        """``until()``: the run is over when it returns True though processes still run (a live
        session's cell: every rank is back to idle); ``readers``: the ranks' event readers, kept
        across runs when the processes are."""
        self.group, self.rec = group, recorder
        self.until = until
        framing = readers if readers is not None else [EventReader() for _ in group.workers]
        self.polling = any(w.pidfd is None for w in group.workers)
        self.sel = selectors.DefaultSelector()
        self.readers = {w.rank: RankReader(w, self.sel, framing[w.rank]) for w in group.workers}
        for w in group.workers:
            if w.pidfd is not None:
                self.sel.register(w.pidfd, selectors.EVENT_READ, (w, "exit"))
        # rank 0's display() and the ranks' input() reach the notebook
        self.bridge = NotebookBridge(recorder)
        self.sel.register(self.bridge.wake_fd, selectors.EVENT_READ, (None, "stdin"))
        pressed = interrupts.wake_fd()  # ■ wakes the loop at once; the runner acts on it after this poll
        if pressed is not None:
            self.sel.register(pressed, selectors.EVENT_READ, (None, "interrupt"))
        if recorder.tracker is not None:  # the launch panel's Stop, served from this loop
            recorder.tracker.attach(
                self.sel, lambda place: recorder.stop_requested(stopped_message(place)), self.stack_targets
            )
        self.finished = False

    def stack_targets(self) -> list[tuple[int, int, str | None]]:
        """The ranks a request for stacks goes to: (rank, pid, how it ended or None), from this loop's thread."""
        return [(w.rank, w.pid, w.status.describe() if w.status else None) for w in self.group.workers]

    def poll(self, wait_s: float) -> bool:
        """Handle what becomes ready within ``wait_s`` seconds; True once the run is over."""
        alive = [w for w in self.group.workers if w.status is None]
        if not alive or (self.until is not None and self.until()):
            return True
        for key, _ in self.sel.select(min(wait_s, 0.02) if self.polling else wait_s):
            if key.fd not in self.sel.get_map():
                continue  # drained and unregistered by an earlier key of this same batch
            who, kind = key.data
            if kind == "stdin":
                self.bridge.on_wake()
            elif kind == "interrupt":
                continue  # (the runner's check, right after this poll, drains it and acts)
            elif kind == "control":
                who.on_ready(key.fd)  # the run's control channel (launch/run_control.py)
            elif kind == "exit":
                self._on_exit(who)
            else:
                self._route(who.w, who.on_readable(kind))  # who: the rank's reader
        if self.polling:
            for w in alive:
                if w.status is None and self.group.poll(w) is not None:
                    self._on_exit(w)
        self.bridge.tick()  # (the recorder's tick is the runner's, once per turn of its loop)
        return False

    def finish(self) -> None:
        """The run is over: read what every rank wrote, close the bridge and the selector (safe twice)."""
        if self.finished:
            return
        self.finished = True
        try:
            self._drain_all()
        finally:
            self.bridge.close()
            self.sel.close()

    def _route(self, w, items) -> None:
        """The items of one rank's reader, in their order: text to the recorder, events to it or the bridge."""
        for item in items:
            if item[0] == "output":
                self.rec.output(w.rank, item[1], item[2])
                continue
            _, kind, payload = item
            if kind == "error" and not self.rec.stopping:
                # A rank that already ended did so before this error was raised (a peer's crash is
                # what a collective reports as "connection reset"): let the recorder see that first.
                for other in self.group.workers:
                    if other is not w and other.status is None and self.group.poll(other) is not None:
                        self._on_exit(other)
            if kind in EVENT_KINDS:
                self.bridge.on_event(w, kind, payload)
            else:
                self.rec.event(w.rank, kind, payload)

    def _drain_all(self) -> None:
        for w in self.group.workers:
            self._route(w, self.readers[w.rank].drain(final=True))

    def _on_exit(self, w) -> None:
        self.group.poll(w)
        if w.pidfd is not None:
            try:
                self.sel.unregister(w.pidfd)
            except KeyError:
                pass
        # everything a finished worker wrote is in its pipes already: read it before judging its exit
        self._route(w, self.readers[w.rank].drain(final=True))
        self.rec.exited(w.rank, w.status)
