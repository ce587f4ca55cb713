"""The kernel loop of one launch: every rank's stdout/stderr/event pipes and exit notifications,
multiplexed in the calling thread (the kernel's main thread, so Ctrl-C lands here).

It routes output (``RankOutputRouter``), feeds progress/metrics to the run display, records
ready/done/result/error events in the report, and on the first failure sends SIGTERM to every
rank and returns after ``TERMINATE_GRACE_S`` at most; the caller's ``WorkerGroup.close()`` does
the rest.
"""

from __future__ import annotations

import os
import selectors
import signal
import time
from typing import TYPE_CHECKING

from .channel import EventReader
from .report import Failure
from .run_control import STOPPED_MESSAGE

if TYPE_CHECKING:  # annotations only: the engine imports this module
    from .engine import LaunchRequest
    from .group import WorkerGroup
    from .output import RankOutputRouter
    from .plan import LaunchPlan
    from .report import LaunchReport

TERMINATE_GRACE_S = 2.0
STOP_GRACE_S = 1.0  # Stop from the launch panel: SIGKILL sooner, so the run ends within 2 s


class EventLoop:
    """The kernel loop: pipes and exits of every rank, multiplexed in the calling thread."""

    def __init__(
        self,
        group: WorkerGroup,
        router: RankOutputRouter,
        report: LaunchReport,
        req: LaunchRequest,
        plan: LaunchPlan,
        t_call: float,
        display=None,
        tracker=None,
    ):
        self.group, self.router, self.report, self.req, self.plan = group, router, report, req, plan
        self.display = display
        self.t_call = t_call
        self.results: list[bytes | None] = [None] * plan.num_processes
        self.readers = [EventReader() for _ in group.workers]
        self.sel = selectors.DefaultSelector()
        self.stopping_since: float | None = None
        self.grace = TERMINATE_GRACE_S
        self.ready = 0
        self.tracker = tracker  # the launch panel's state file and Stop channel (run_tracker.RunTracker)
        if tracker is not None:
            tracker.attach(self.sel, self._stop_from_panel)
        for w in group.workers:
            p = w.pipes
            for fd in p.read_ends():
                os.set_blocking(fd, False)
            self.sel.register(p.stdout_r, selectors.EVENT_READ, (w, "stdout"))
            self.sel.register(p.stderr_r, selectors.EVENT_READ, (w, "stderr"))
            self.sel.register(p.events_r, selectors.EVENT_READ, (w, "events"))
            if w.pidfd is not None:
                self.sel.register(w.pidfd, selectors.EVENT_READ, (w, "exit"))

    def run(self) -> None:
        try:
            self._loop()
        finally:
            self._drain_all()
            self.sel.close()

    def _loop(self) -> None:
        deadline = self.t_call + self.plan.timeout if self.plan.timeout else None
        polling = any(w.pidfd is None for w in self.group.workers)
        while True:
            alive = [w for w in self.group.workers if w.status is None]
            if not alive:
                return
            now = time.monotonic()
            if self.stopping_since is not None and now - self.stopping_since > self.grace:
                return  # close() sends SIGKILL to what is left
            if deadline is not None and now >= deadline and self.stopping_since is None:
                self._fail_timeout()
                continue
            wait = 0.1
            if deadline is not None and self.stopping_since is None:
                wait = min(wait, max(0.0, deadline - now))
            if polling:
                wait = min(wait, 0.02)
            for key, _ in self.sel.select(wait):
                if key.fd not in self.sel.get_map():
                    continue  # drained and unregistered by an earlier key of this same batch
                w, kind = key.data
                if kind == "exit":
                    self._on_exit(w)
                elif kind == "control":
                    w.on_ready(key.fd)  # w: the run's control channel
                else:
                    self._read(w, kind, key.fd)
            if polling:
                for w in alive:
                    if w.status is None and self.group.poll(w) is not None:
                        self._on_exit(w)
            self.router.flush_stale()
            if self.display is not None:
                self.display.tick()
            if self.tracker is not None:
                self.tracker.tick(self.report)

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
                self._on_event(w, ev_kind, payload)
        else:
            self.router.feed(w.rank, kind, data)
        return True

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
        rr = self.report.ranks[w.rank]
        rr.status = w.status
        rr.ended_s = time.monotonic() - self.t_call
        if w.status.ok:
            if self.req.return_all or w.rank == 0:
                if self.results[w.rank] is None and self.stopping_since is None:
                    self._fail(
                        Failure(
                            rank=w.rank,
                            kind="exit",
                            message="exited with code 0 before sending its "
                            "result (os._exit(0) or sys.exit(0) in the launched code?)",
                            t=time.monotonic(),
                            status=w.status,
                        )
                    )
            return
        if not any(f.rank == w.rank for f in self.report.failures):
            if self.stopping_since is not None and w.status.signal == signal.SIGTERM:
                return  # ended by our SIGTERM; any other end (exit code, SIGKILL, SIGSEGV) is the rank's own
            self._fail(
                Failure(rank=w.rank, kind="exit", message=w.status.describe(), t=time.monotonic(), status=w.status)
            )
        else:
            for f in self.report.failures:
                if f.rank == w.rank:
                    f.status = w.status

    def _on_event(self, w, kind: str, payload) -> None:
        if kind == "ready":
            rr = self.report.ranks[w.rank]
            rr.ready_s = payload["t"] - self.t_call
            self.ready += 1
            if self.ready == len(self.group.workers):
                self.report.startup_s = max(r.ready_s for r in self.report.ranks)
        elif kind == "done":
            self.report.ranks[w.rank].done_s = payload["t"] - self.t_call
        elif kind == "result":
            self.results[w.rank] = payload
        elif kind == "metrics":
            self.report.metrics.extend(payload)
        elif kind == "error":
            if self.stopping_since is None:
                # A rank that already ended did so before this error was raised (a peer's crash is
                # what a collective reports as "connection reset"): record it first.
                for other in self.group.workers:
                    if other is not w and other.status is None and self.group.poll(other) is not None:
                        self._on_exit(other)
            self._fail(Failure.from_error(w.rank, payload))
        self.report.event_counts[kind] = self.report.event_counts.get(kind, 0) + 1
        if self.display is not None and kind in ("progress", "metrics"):
            self.display.on_event(w.rank, kind, payload)
        if self.req.on_event is not None:
            self.req.on_event(w.rank, kind, payload)

    def _fail(self, failure: Failure) -> None:
        self.report.failures.append(failure)
        if self.stopping_since is None:
            self.report.outcome = "failed"
            self.stopping_since = time.monotonic()
            self.group.signal_all(signal.SIGTERM)  # close() follows with SIGKILL after the grace period

    def _stop_from_panel(self) -> bool:
        """Stop from the launch panel: the failure path (SIGTERM to all, SIGKILL after STOP_GRACE_S)."""
        if self.stopping_since is not None:
            return False
        self._fail(Failure(rank=None, kind="stopped", t=time.monotonic(), message=STOPPED_MESSAGE))
        self.report.outcome, self.grace = "stopped", STOP_GRACE_S
        return True

    def _fail_timeout(self) -> None:
        self._fail(
            Failure(
                rank=None,
                kind="timeout",
                t=time.monotonic(),
                message=f"the run exceeded timeout={self.plan.timeout:g}s and every rank was stopped",
            )
        )
        self.report.outcome = "timeout"
