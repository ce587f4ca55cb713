"""The run recorder: the one place that turns what an engine observes into the run's outcome.

Every engine (local processes, torch's elastic launcher, Ray Train) feeds it the same
observations — a rank's output, its events (``ready``, ``done``, ``progress``, ``metrics``,
``result``, ``error``), a rank's exit, a timeout, an interrupt, a failure of the engine itself —
and the recorder alone fills the ``LaunchReport``, decides the outcome and the root cause, asks
the engine to stop every rank at the first failure, and builds the ``WorkerError``.

**Rank state.** The recorder alone moves each rank's ``RankReport.state`` (``run_contract.RankState``,
transitions in its docstring); the widgets' status line, the failure message, the state file and, through
it, the server and the panel read it. ``live_rank_state()`` is the same decision for a live session's
ranks between requests, when no recorder runs.

**Clock.** Failure times are compared to find the root cause, so they must come from one clock:
the engine declares it. Ranks on this machine are timed on ``time.monotonic()``; ranks that
may run on other machines (Ray) on wall time. Workers stamp their events with both; the
recorder reads the one of its clock and stamps what it sees itself (exits, timeouts) on it too.

Example::

    >>> rec = RunRecorder(report, clock="monotonic", stop=group_stop)   # doctest: +SKIP
    >>> rec.event(1, "error", payload)        # first failure: stop() is called once
    >>> rec.outcome(return_all=False)         # raises WorkerError naming rank 1
"""

from __future__ import annotations

import signal
import sys
import time

from ..engines.contract import ExitStatus
from ..errors import LaunchStoppedError, LaunchTimeoutError, WorkerError
from ..run_contract import RankState, RunState
from ..worker.result_segments import Received
from .observers import RunObservers
from .report import Failure, FailureKind, LaunchReport, RankReport, format_failure_message
from .run_control import STOPPED_MESSAGE

CLOCKS = {"monotonic": time.monotonic, "wall": time.time}
PANEL_STOP_GRACE_S = 1.0  # Stop from the launch panel: SIGKILL sooner than after a failure, so it ends within 2 s
ERRORS = {RunState.TIMEOUT: LaunchTimeoutError, RunState.STOPPED: LaunchStoppedError}  # by state; else WorkerError


class RunRecorder:
    """Receives every engine's observations; decides outcome and root cause on one clock."""

    def __init__(
        self,
        report: LaunchReport,
        *,
        clock: str = "monotonic",
        router=None,
        stop=None,
        tails=None,
        peer_hint: str | None = None,
        t_call: float | None = None,
        where=None,
        observers: RunObservers | None = None,
    ):
        self.report = report
        self._by_rank: tuple[list | None, dict[int, RankReport]] = (None, {})  # (report.ranks, its index by rank)
        self.where = where  # where() -> each unfinished rank's line and collective, asked before a timeout or Stop
        self.clock = clock
        self.now = CLOCKS[clock]
        self.t_call = time.monotonic() if t_call is None else t_call  # when the launch began (monotonic)
        self.t0 = self.now() - (time.monotonic() - self.t_call)  # the same moment on the recorder's clock
        self.router = router
        self.observers = observers if observers is not None else RunObservers()  # registered by the runner
        self.tails = tails if tails is not None else router  # tail(rank) for the failure message
        self.peer_hint = peer_hint
        self._stop = stop
        self.stopping_since: float | None = None  # monotonic: when stopping began (grace periods)
        self.grace_s: float | None = None  # SIGTERM → SIGKILL grace the engine's loop gives (None: its own)
        self.results: list[Received | None] = [None] * report.world_size
        self.segments = None  # the engine's shared-memory folder where big return values arrive (SegmentFolder)
        self.notes: list[str] = []  # what the engine did about the failure (a live session restarted, say)
        self.request: int | None = None  # a live session's request id (its ranks go back to idle), None: one-shot
        report.clock = clock

    # -- what the engine tells ------------------------------------------------------------
    def add_ranks(self, ranks, *, request: int | None = None) -> None:
        """``ranks``: (rank, pid) pairs of the processes the engine started; or, with ``request``, the live
        ranks that take request ``request`` (0: the start of the session, when they are still starting)."""
        paths = getattr(self.router, "log_paths", {})
        self.request = request
        first = RankState.BUSY if request else RankState.STARTING
        self.report.ranks = [RankReport(rank=r, pid=pid, log_path=paths.get(r, ""), state=first) for r, pid in ranks]

    def rank_state(self, rank: int) -> RankState | None:
        """Rank ``rank``'s state as this recorder decided it (None: not a rank of this run)."""
        rr = self._rank(rank)
        return None if rr is None else rr.state

    @property
    def stopping(self) -> bool:
        return self.stopping_since is not None

    def output(self, rank: int, stream: str, data: bytes) -> None:
        self.router.feed(rank, stream, data)

    def event(self, rank: int, kind: str, payload) -> None:
        """One worker event: ``ready``, ``done``, ``progress``, ``pace`` (a hidden bar's count), ``metrics``,
        ``result``, ``error`` or ``idle``."""
        rr = self._rank(rank)
        if kind == "error" and self.stopping and payload.get("type") == "KeyboardInterrupt":
            kind = "stopped"  # the interrupt we sent to stop this rank (a live session's), not a failure of its own
        if kind == "ready":
            if rr is not None:
                rr.pid = payload.get("pid", rr.pid)
                rr.ready_s = self._since(payload)
                if self.request is None:
                    self._move(rr, RankState.RUNNING)
                if all(r.ready_s is not None for r in self.report.ranks):
                    self.report.startup_s = max(r.ready_s for r in self.report.ranks)
        elif kind == "done":
            if rr is not None:
                rr.done_s = self._since(payload)
                if self.request is None:  # (a live rank's code returned: it is busy until back to idle)
                    self._move(rr, RankState.DONE)
        elif kind == "result":
            self.results[rank] = self._take_result(rank, payload)
        elif kind == "metrics":
            self.report.metrics.extend(payload)
        elif kind == "left":  # the rank is leaving on its own (sys.exit(0)): see _blame_departures
            if rr is not None:
                rr.left = {**payload, "t": payload.get("wall" if self.clock == "wall" else "t")}
        elif kind == "error":
            self._fail(Failure.from_error(rank, payload, self.clock))
        elif kind == "idle":
            if rr is not None and payload.get("cell") == self.request:
                self._move(rr, RankState.IDLE)  # back for this request, whatever its outcome
        self.report.event_counts[kind] = self.report.event_counts.get(kind, 0) + 1
        self.observers.event(rank, kind, payload)  # once decided: the widgets, the Runs view, the caller's hook

    def exited(self, rank: int, status: ExitStatus) -> None:
        """A rank's process ended (or, for engines without processes of ours, its code returned)."""
        rr = self._rank(rank)
        if rr is not None:
            rr.status = status
            rr.ended_s = time.monotonic() - self.t_call
            if self.request is not None:
                self._move(rr, RankState.DEAD)  # a live rank's process is gone: the world decides what next
        own = [f for f in self.report.failures if f.rank == rank]
        if own:
            for f in own:
                f.status = status
            return
        if status.ok:
            if self._must_return(rank) and self.results[rank] is None and not self.stopping:
                self._fail(
                    Failure(
                        rank=rank,
                        kind=FailureKind.EXIT,
                        message="exited with code 0 before sending its "
                        "result (os._exit(0) or sys.exit(0) in the launched code?)",
                        t=self.now(),
                        status=status,
                    )
                )
            elif rr is not None:
                self._move(rr, RankState.DONE)
            return
        if self.stopping and status.signal == signal.SIGTERM:
            if rr is not None:
                self._move(rr, RankState.STOPPED)
            return  # ended by our SIGTERM; any other end (exit code, SIGKILL, SIGSEGV) is the rank's own
        self._fail(Failure(rank=rank, kind=FailureKind.EXIT, message=status.describe(), t=self.now(), status=status))

    def final_status(self, rank: int, status: ExitStatus | None) -> None:
        """How a rank's process really ended, once the engine has reaped it (after any stop)."""
        rr = self._rank(rank)
        if rr is not None and status is not None:
            rr.status = status

    def timeout(self, seconds: float) -> None:
        self._note_where()
        self._fail(
            Failure(
                rank=None,
                kind=FailureKind.TIMEOUT,
                t=self.now(),
                message=f"the run exceeded timeout={seconds:g}s",
            ),
            state=RunState.TIMEOUT,
        )

    def engine_failed(self, message: str) -> None:
        """The engine itself failed without any rank reporting an error (a Ray Train failure, say)."""
        if not self.report.failures:
            self._fail(Failure(rank=None, kind=FailureKind.EXIT, t=self.now(), message=message))

    def stop_requested(self, message: str = STOPPED_MESSAGE, grace_s: float | None = PANEL_STOP_GRACE_S) -> bool:
        """The launch panel's Stop (over the run's control channel); True if the run is stopping now.

        Stopping goes the failure path, with a shorter grace before SIGKILL so the run ends within 2 s
        (``grace_s``; None: the engine's own, as a live cell's ranks come back to idle in theirs).
        """
        if self.stopping:
            return False
        self.grace_s = grace_s
        self._note_where()
        self._fail(Failure(rank=None, kind=FailureKind.STOPPED, t=self.now(), message=message), state=RunState.STOPPED)
        return True

    def _note_where(self) -> None:
        """Before the ranks are stopped: where each unfinished one was, for the error (``launch.rank_stacks``)."""
        where = self.where() if self.where is not None and not self.stopping else ""
        if where:
            self.note(f"where the unfinished ranks were:\n{where}")

    def interrupted(self) -> None:
        self.report.state = RunState.INTERRUPTED

    def stop_for_interrupt(self) -> None:
        """Ctrl-C where the engine must still bring the ranks back (a live session): stop them all now."""
        self.report.state = RunState.INTERRUPTED
        if not self.stopping:
            self._begin_stop()

    def note(self, text: str) -> None:
        """A line the engine adds to the run's error: what it did about the failure."""
        self.notes.append(text)
        self.report.notes.append(text)

    # -- the outcome ----------------------------------------------------------------------
    def close(self) -> None:
        """The engine has stopped every rank and every pipe is drained: finish output, timings, root cause."""
        self._blame_departures()
        if self.request is None:  # a one-shot rank still starting or running now was stopped by nblaunch
            for rr in self.report.ranks:
                if rr.state in (RankState.STARTING, RankState.RUNNING):
                    self._move(rr, RankState.STOPPED)
        if self.router is not None:
            self.router.finish()
        self.report.ended_at = time.time()
        self.report.wall_s = time.monotonic() - self.t_call

    def outcome(self, return_all: bool):
        """Rank 0's value and every rank's (with ``return_all``); raises the run's error if it failed."""
        error = self._error()
        if error is None:
            try:
                values = self._values()
            except WorkerError as e:
                error = e
        self.observers.finish(error)
        if error is not None:
            raise error
        self.report.state = RunState.DONE
        return values[0], (values if return_all else None)

    def finish_interrupted(self, exc: BaseException) -> None:
        self.report.state = RunState.INTERRUPTED
        self.observers.finish(exc)

    # -- inside ---------------------------------------------------------------------------
    def _rank(self, rank: int) -> RankReport | None:
        # (asked for every event and every look at a rank's state: an index, not a walk of the list)
        if self._by_rank[0] is not self.report.ranks:
            self._by_rank = (self.report.ranks, {rr.rank: rr for rr in self.report.ranks})
        return self._by_rank[1].get(rank)

    def _since(self, payload: dict) -> float:
        t = payload.get("wall" if self.clock == "wall" else "t")
        return (t - self.t0) if t is not None else (self.now() - self.t0)

    def _must_return(self, rank: int) -> bool:
        return rank == 0 or self.report.return_all

    def _move(self, rr: RankReport, state: RankState) -> None:
        """The one place a rank's state changes: final states stay, except DONE, which a bad exit makes FAILED."""
        if rr.state.is_final and not (rr.state is RankState.DONE and state is RankState.FAILED):
            return
        rr.state = state

    def _fail(self, failure: Failure, state: RunState = RunState.FAILED) -> None:
        self.report.failures.append(failure)
        rr = self._rank(failure.rank) if failure.rank is not None else None
        if rr is not None and self.request is None:  # a live rank that failed a request goes back to idle
            self._move(rr, RankState.FAILED)
        if not self.stopping:
            self.report.state = state
            self._begin_stop()

    def _begin_stop(self) -> None:
        self.stopping_since = time.monotonic()
        if self._stop is not None:
            self._stop()

    def _error(self) -> WorkerError | None:
        rep = self.report
        if not rep.failures:
            return None
        root = rep.root_cause()
        message = format_failure_message(rep, root, self.tails)
        if self.peer_hint and root.caused_by_peer:
            message += "\n" + self.peer_hint
        if self.notes:
            message += "\n" + "\n".join(self.notes)
        cls = ERRORS.get(rep.state, WorkerError)
        return cls(message, rank=root.rank, failures=rep.failures, report=rep)

    def _blame_departures(self) -> None:
        """Ranks that left on their own before the peer-loss errors they caused become the root cause."""
        rep = self.report
        peer_losses = [f for f in rep.failures if f.caused_by_peer]
        if not peer_losses or any(not f.caused_by_peer and f.kind is not FailureKind.LEFT for f in rep.failures):
            return  # nothing to explain, or a real failure explains it
        first_loss = min(peer_losses, key=lambda f: f.t)
        failed = {f.rank for f in rep.failures}
        for rr in rep.ranks:
            left = rr.left
            if left is None or rr.rank in failed or left["t"] > first_loss.t:
                continue
            self._move(rr, RankState.FAILED)
            rep.failures.append(
                Failure(
                    rank=rr.rank,
                    kind=FailureKind.LEFT,
                    message=f"left on its own ({left['where']}; exit code {left['code']}) before rank "
                    f"{first_loss.rank}'s collective finished",
                    t=left["t"],
                    phase="run",
                )
            )

    def _take_result(self, rank: int, body) -> Received | None:
        """The result as it arrives: its shared-memory segment mapped now, so nothing of it outlives the launch."""
        try:
            received = Received.take(body, self.segments)
        except (OSError, ValueError) as e:
            why = f"rank {rank}'s return value could not be read from shared memory: {e}"
            self._fail(Failure(rank=rank, kind=FailureKind.ERROR, message=why, t=CLOCKS[self.clock](), phase="result"))
            return None
        note = received.fallback_note(rank)
        if note:
            self.report.notes.append(note)
            print(note, file=sys.stderr)  # in a kernel, the cell's stderr: the run goes on and succeeds
        return received

    def _values(self) -> list:
        values = []
        for rank, received in enumerate(self.results):
            self.results[rank] = None  # the value's tensors alone keep a shared-memory segment alive from here
            try:
                values.append(received.loads() if received is not None else None)
            except Exception as e:
                self.report.state = RunState.FAILED
                raise WorkerError(
                    f"nblaunch: rank {rank}'s return value arrived but cannot be rebuilt in the kernel: "
                    f"{type(e).__name__}: {e}. Return plain data (numbers, lists, dicts, tensors, state_dict()), or "
                    "objects whose classes the kernel can import.",
                    rank=rank,
                    failures=[],
                    report=self.report,
                ) from None
        return values


def live_rank_state(*, process_ended: bool, session_over: bool, starting: bool, in_request: RankState | None):
    """A live session's rank between (or during) requests: DEAD once its process or the session ended,
    else what the request's recorder says (``in_request``), else STARTING while the world comes up,
    else IDLE.

    Example::

        >>> live_rank_state(process_ended=False, session_over=False, starting=False, in_request=None)
        <RankState.IDLE: 'idle'>
    """
    if process_ended or session_over:
        return RankState.DEAD
    if in_request is not None:
        return in_request
    return RankState.STARTING if starting else RankState.IDLE
