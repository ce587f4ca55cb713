"""One run of the kernel loop over a live session's ranks: a cell, a function call, a push, or the start.

``LiveRunEngine`` is an ``engines.contract.Engine`` and goes through the same
``launch.runner.run_engine`` as a one-shot launch (same report, output routing, widgets and
RunRecorder). What differs: the ranks are already running, the run ends when every rank taking
part is back to ``idle`` for this request (not when processes exit), and stopping a rank means
SIGINT (``KeyboardInterrupt`` in its Python code), not SIGTERM. A rank that is not back to idle
within ``SETTLE_S`` of the stop — stuck in a C-level collective, which no Python interrupt
reaches under gloo — a rank that died, or ranks whose process group is out of step (they ran
different numbers of collectives) mean the world cannot go on: it is restarted (new processes,
same flags), and the error says so plainly.

Example::

    >>> run_engine(LiveRunEngine(session, request), req, plan, session.log_dir, out, err)   # doctest: +SKIP
"""

from __future__ import annotations

import os
import signal
import time

from ..engines.contract import Engine
from ..engines.local_loop import EventLoop
from ..errors import CellInterrupted
from ..run_contract import RankState

SETTLE_S = 2.0  # how long ranks get to come back to idle after a stop (and Ctrl-C) before the restart
RESIGNAL_S = 0.5  # a rank not back yet gets SIGINT again this often (one may land just before its code starts)
RESTARTED = "the live session was restarted: its state is gone (new processes, same flags)"


class LiveRunEngine(Engine):
    """The engine contract over a live session's ranks, for one request."""

    stop_grace_s = SETTLE_S  # (run_engine's deadline is the plan's timeout, the session's or the cell's)
    defer_display = True  # a quick cell opens no widget (launch.runner.run_engine)

    def __init__(self, session, req_id: int, ranks, *, blob: bytes | None, timeout: float | None, label: str):
        """(``timeout`` is the plan's, which ``run_engine`` applies: accepted here for the session's calls.)"""
        self.session, self.req_id, self.ranks = session, req_id, tuple(ranks)
        self.blob, self.label = blob, label
        self.render = session.render
        self.signalled_at: float | None = None
        self.recorder = self.loop = None
        self.restart_reason: str | None = None

    # -- the engine contract ---------------------------------------------------------------
    def prepare(self) -> int:
        return self.session.world.port

    def start(self, recorder) -> None:
        workers = self.session.world.group.workers
        recorder.add_ranks(((w.rank, w.pid) for w in workers if w.rank in self.ranks), request=self.req_id)
        recorder.report.session = self.label
        self.recorder = recorder
        if self.blob is not None:
            self.session.send(self.ranks, self.blob)
            self.blob = None  # the kernel keeps no copy of what it sent

    def stop(self) -> None:
        """The first failure (or Ctrl-C, or the timeout): KeyboardInterrupt in every rank still running it."""
        if self.signalled_at is None:
            self._interrupt()

    def _interrupt(self) -> None:
        self.signalled_at = time.monotonic()
        for w in self.session.world.group.workers:
            if w.rank in self.ranks and w.status is None and not self._back(w.rank):
                try:
                    os.killpg(w.pid, signal.SIGINT)
                except (ProcessLookupError, PermissionError):
                    pass

    def poll(self, recorder, wait_s: float) -> bool:
        if self.loop is None:
            self.loop = EventLoop(
                self.session.world.group,
                recorder,
                until=lambda: self._all_back(recorder),
                readers=self.session.readers,
            )
        return self.loop.poll(wait_s)

    def interrupt_error(self, recorder) -> BaseException:
        back = "every rank stopped the cell and kept its state" if self._all_back(recorder) else ""
        return CellInterrupted(back or "the cell was interrupted")

    def close(self, grace: float, recorder) -> None:
        """Decide whether the world can go on; if not, restart it and say so. (Not for the start's own run:
        ranks that cannot come up are the session's to handle, see ``LiveSession._bring_up``.)"""
        if self.loop is not None:
            self.loop.finish()
        reason = self._broken(recorder) if self.req_id else None
        if reason is None or self.session.runs.stop_asked.is_set():
            return  # (Stop from the launch panel: the session closes the world next, no restart)
        self.restart_reason = reason
        self.session.restart_world()
        message = f"nblaunch: {reason}; {RESTARTED}."
        if recorder.report.outcome == "interrupted":
            self.session.err.write(message + "\n")
            self.session.err.flush()
            recorder.report.notes.append(message)
        elif not recorder.report.failures:
            recorder.engine_failed(f"{reason}; {RESTARTED}.")
        else:
            recorder.note(message)

    # -- inside ----------------------------------------------------------------------------
    def _back(self, rank: int) -> bool:
        return self.recorder is not None and self.recorder.rank_state(rank) is RankState.IDLE

    def _all_back(self, recorder) -> bool:
        """The loop's end condition; while stopping, it also repeats the interrupt for ranks not back yet."""
        back = all(
            self._back(w.rank) for w in self.session.world.group.workers if w.rank in self.ranks and w.status is None
        )
        if not back and self.signalled_at is not None and time.monotonic() - self.signalled_at >= RESIGNAL_S:
            self._interrupt()
        return back

    def _broken(self, recorder) -> str | None:
        workers = self.session.world.group.workers
        dead = [w for w in workers if self.session.world.group.poll(w) is not None]
        if dead:
            return "; ".join(f"rank {w.rank} (pid {w.pid}) ended: {w.status.describe()}" for w in dead)
        stuck = [w.rank for w in workers if w.rank in self.ranks and recorder.rank_state(w.rank) is not RankState.IDLE]
        if stuck:
            names = ", ".join(map(str, stuck))
            return (
                f"rank(s) {names} did not come back within {SETTLE_S:g}s of being interrupted (inside a collective "
                "waiting for a peer that had stopped, which no Python interrupt reaches under gloo)"
            )
        if set(self.ranks) == {w.rank for w in workers}:
            seqs = {r: recorder.idle[r].get("seq") for r in self.ranks}
            if None not in seqs.values() and len(set(seqs.values())) > 1:
                counts = ", ".join(f"rank {r}: {s}" for r, s in sorted(seqs.items()))
                return (
                    f"the ranks ran different numbers of collectives ({counts}), so their next collective would "
                    "pair up wrong calls"
                )
        return None
