"""The kernel loop of a local launch: every rank's stdout/stderr/event pipes and exit notifications,
multiplexed in the calling thread (the kernel's main thread, so Ctrl-C lands here).

It only observes: bytes go to the recorder as output, events as events, process exits as exits,
and the deadline as a timeout. The recorder decides what they mean and, at the first failure,
asks the engine to stop (SIGTERM to every rank); the loop then returns after
``TERMINATE_GRACE_S`` at most, and the engine's ``close()`` does the rest.

Example::

    >>> EventLoop(group, recorder, timeout=None).run()     # doctest: +SKIP
"""

from __future__ import annotations

import os
import selectors
import time

from ..channel import EventReader
from .local_bridge import EVENT_KINDS, NotebookBridge

TERMINATE_GRACE_S = 2.0


class EventLoop:
    """The kernel loop: pipes and exits of every rank, multiplexed in the calling thread."""

    def __init__(
        self,
        group,
        recorder,
        *,
        timeout: float | None,
        t_call: float,
        until=None,
        give_up_at: float | None = None,
        readers: list[EventReader] | None = None,
    ):
        """``until()``: the run is over when it returns True though processes still run (a live
        session's cell: every rank is back to idle); ``give_up_at`` (monotonic): return then at the
        latest; ``readers``: the ranks' event readers, kept across runs when the processes are."""
        self.group, self.rec = group, recorder
        self.deadline = t_call + timeout if timeout else None
        self.timeout_s = timeout
        self.until, self.give_up_at = until, give_up_at
        self.readers = readers if readers is not None else [EventReader() for _ in group.workers]
        self.sel = selectors.DefaultSelector()
        for w in group.workers:
            p = w.pipes
            for fd in (p.stdout_r, p.stderr_r, p.events_r):
                os.set_blocking(fd, False)
            self.sel.register(p.stdout_r, selectors.EVENT_READ, (w, "stdout"))
            self.sel.register(p.stderr_r, selectors.EVENT_READ, (w, "stderr"))
            self.sel.register(p.events_r, selectors.EVENT_READ, (w, "events"))
            if w.pidfd is not None:
                self.sel.register(w.pidfd, selectors.EVENT_READ, (w, "exit"))
        # rank 0's display() and input() reach the notebook, in order with its text
        self.bridge = NotebookBridge(self, recorder)
        self.sel.register(self.bridge.wake_fd, selectors.EVENT_READ, (None, "stdin"))
        if recorder.tracker is not None:  # the launch panel's Stop, served from this loop
            recorder.tracker.attach(self.sel, recorder.stop_requested, self.stack_targets)

    def stack_targets(self) -> list[tuple[int, int, str | None]]:
        """The ranks a request for stacks goes to: (rank, pid, how it ended or None), from this loop's thread."""
        return [(w.rank, w.pid, w.status.describe() if w.status else None) for w in self.group.workers]

    def run(self) -> None:
        try:
            self._loop()
        finally:
            self._drain_all()
            self.bridge.close()
            self.sel.close()

    def _loop(self) -> None:
        polling = any(w.pidfd is None for w in self.group.workers)
        while True:
            alive = [w for w in self.group.workers if w.status is None]
            if not alive or (self.until is not None and self.until()):
                return
            now = time.monotonic()
            if self.give_up_at is not None and now >= self.give_up_at:
                return
            stopping = self.rec.stopping_since
            if stopping is not None and now - stopping > (self.rec.grace_s or TERMINATE_GRACE_S):
                return  # close() sends SIGKILL to what is left
            if self.deadline is not None and now >= self.deadline and stopping is None:
                self.rec.timeout(self.timeout_s)
                continue
            wait = 0.1 if self.give_up_at is None else max(0.0, min(0.1, self.give_up_at - now))
            if self.deadline is not None and stopping is None:
                wait = min(wait, max(0.0, self.deadline - now))
            if polling:
                wait = min(wait, 0.02)
            for key, _ in self.sel.select(wait):
                if key.fd not in self.sel.get_map():
                    continue  # drained and unregistered by an earlier key of this same batch
                w, kind = key.data
                if kind == "stdin":
                    self.bridge.on_wake()
                elif kind == "control":
                    w.on_ready(key.fd)  # w: the run's control channel (launch/run_control.py)
                elif kind == "exit":
                    self._on_exit(w)
                else:
                    self._read(w, kind, key.fd)
            if polling:
                for w in alive:
                    if w.status is None and self.group.poll(w) is not None:
                        self._on_exit(w)
            self.rec.tick()
            self.bridge.tick()

    def _read(self, w, kind: str, fd: int) -> bool:
        try:
            data = os.read(fd, 1 << 20)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if not data:
            self.sel.unregister(fd)
            return False
        if kind == "events":
            for ev_kind, payload in self.readers[w.rank].feed(data):
                if ev_kind == "error" and not self.rec.stopping:
                    # A rank that already ended did so before this error was raised (a peer's crash is
                    # what a collective reports as "connection reset"): let the recorder see that first.
                    for other in self.group.workers:
                        if other is not w and other.status is None and self.group.poll(other) is not None:
                            self._on_exit(other)
                if ev_kind in EVENT_KINDS:
                    self.bridge.on_event(w, ev_kind, payload)
                else:
                    self.rec.event(w.rank, ev_kind, payload)
        else:
            self.bridge.text(w, kind, data)
        return True

    def read_pending_events(self, w) -> None:
        """Read and handle every event the worker has sent so far (the bridge orders text by them)."""
        fd = w.pipes.events_r
        while fd in self.sel.get_map() and self._read(w, "events", fd):
            pass

    def _drain(self, w) -> None:
        """Everything a finished worker wrote is in its pipes already: read it before judging its exit."""
        for fd, kind in ((w.pipes.events_r, "events"), (w.pipes.stdout_r, "stdout"), (w.pipes.stderr_r, "stderr")):
            try:
                self.sel.get_key(fd)
            except KeyError:
                continue
            while self._read(w, kind, fd):
                pass

    def _drain_all(self) -> None:
        for w in self.group.workers:
            self._drain(w)

    def _on_exit(self, w) -> None:
        self.group.poll(w)
        if w.pidfd is not None:
            try:
                self.sel.unregister(w.pidfd)
            except KeyError:
                pass
        self._drain(w)
        self.rec.exited(w.rank, w.status)
