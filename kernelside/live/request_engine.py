"""One run of the kernel loop over a live session's ranks: a cell, a function call, a push, or the start.

``LiveRunEngine`` is an ``engines.contract.Engine`` and goes through the same
``launch.runner.run_engine`` as a one-shot launch (same report, output routing, widgets and
RunRecorder). What differs: the ranks are already running, the run ends when every rank taking
part is back to ``idle`` for this request (not when processes exit), and stopping a rank brings it
back to idle with its namespace instead of ending it:

- SIGINT (``KeyboardInterrupt`` in its Python code), after asking it where it is (``where``);
- a rank still not back ``ABORT_AFTER_S`` later waits in a C-level collective, which no Python
  interrupt reaches: every rank is told to ``abort`` (close its process-group sockets, abort its NCCL
  communicators: ``worker.live_rescue``), so every blocked collective returns at once;
- then, if the group was aborted or the ranks ran different numbers of collectives, every rank
  ``rebuild``s the default group in place (same processes, DDP models re-pointed).

Ranks that wait in different collectives (``waiting`` events) are named as the failure at once.

The engine observes and judges; it never acts on the world. ``close()`` leaves its ``Verdict`` on the
world — ``KEPT`` (every rank kept its state, the group as it was), ``REBUILT`` (the group rebuilt in the
same processes), ``RESTART`` with the reason — and says it in the run's error; the session acts on it, in
one place (``LiveSession._act``).

A rank that is alive but slow to come back (a loaded machine, a long C call, a debugger) is waited for,
however long it takes: its state is worth more than the wait. ``SETTLE_S`` after the stop, the cell says
once what failed, which rank it still waits for and where, and that ■ again stops waiting. The world is
restarted (new processes, same flags) only when a rank process is gone, when a rebuild failed, or when
the user pressed ■ again, and the error says so plainly.

Example::

    >>> run_engine(LiveRunEngine(session, request), req, plan, session.log_dir, out, err)   # doctest: +SKIP
"""

from __future__ import annotations

import pickle
import signal
import time

from ..engines.contract import Engine
from ..engines.local_loop import EventLoop
from ..errors import CellInterrupted
from ..rank_place import place_line
from ..run_contract import RankState, RunState
from ..short_traceback import first_line
from ..worker.gather_agreement import GatherRelay
from .world import KEPT_WORLD, Verdict, WorldFate

SETTLE_S = 2.0  # a rank not back this long after a stop is named in the cell as still awaited (never given up on)
RESIGNAL_S = 0.5  # a rank not back yet gets SIGINT again this often (one may land just before its code starts)
WHERE_WAIT_S = 1.0  # the longest the end of a stopped request waits for the ranks' answers to ``where``
ABORT_AFTER_S = 0.2  # a rank not back this long after SIGINT waits in C: every rank closes its group sockets
RESTARTED = "the live session was restarted: its state is gone (new processes, same flags)"
REBUILT = "the process group was rebuilt in the same processes: every rank kept its state"
REPLACING = "a new actor takes each lost rank's place in its placement-group bundle, with none of its state; the \
other ranks keep theirs, on a process group rebuilt with the new rank(s)"
KEPT = "no rank was left waiting in a collective: every rank kept its state, and the process group needed no rebuild"


class LiveRunEngine(Engine):
    """The engine contract over a live session's ranks, for one request."""

    defer_display = True  # a quick cell opens no widget (launch.runner.run_engine)

    def __init__(self, session, req_id: int, ranks, *, blob: bytes | None, timeout: float | None, label: str):
        """(``timeout`` is the plan's, which ``run_engine`` applies: accepted here for the session's calls.)"""
        self.session, self.req_id, self.ranks = session, req_id, tuple(ranks)
        self.blob, self.label = blob, label
        self.render = session.render
        self.signalled_at: float | None = None
        self.recorder = self.loop = None
        self.verdict = KEPT_WORLD  # what this request left of the world, judged in close()
        self.aborted = False  # every rank was told to close its process-group sockets
        self.rebuilt: int | None = None  # the group generation every rank came back with
        self.rebuild_notes: list[str] = []  # what still holds the old group (from the ranks)
        self.where: dict[int, dict] = {}  # rank -> where it was when stopped (worker.live_rescue.where_main)
        self.asked: set[int] = set()  # ranks asked where they were; ``answered``: those whose answer came
        self.answered: set[int] = set()
        self.waiting: dict[int, dict] = {}  # rank -> the collective it has waited in for a while
        self.idle: dict[int, dict] = {}  # rank -> its last ``idle`` event (back waiting: group, seq, notes)
        self.mismatch = False  # the failure is ranks waiting in collectives that never meet (said in full)
        self.rebuilding: int | None = None  # the generation the ranks are rebuilding the group to
        self.awaited_said = False  # the cell was told which rank it still waits for
        self.given_up = False  # ■ again while ranks were still coming back: the user wants no more waiting
        self.relay = GatherRelay(lambda: session.world.store, str(req_id), session.plan.num_processes)

    @property
    def rank_logs_made(self) -> bool:
        """A request's ranks have their log files: the start's own run made them."""
        return self.req_id != 0

    @property
    def stop_grace_s(self) -> float | None:
        """No limit for a request's ranks, which hold the session's state; the start's own run has none to keep."""
        return None if self.req_id else SETTLE_S

    # -- the engine contract ---------------------------------------------------------------
    def prepare(self) -> int:
        return self.session.world.port

    def start(self, recorder) -> None:
        workers = self.session.world.group.workers
        recorder.add_ranks(((w.rank, w.pid) for w in workers if w.rank in self.ranks), request=self.req_id)
        recorder.report.session = self.label
        recorder.segments = self.session.world.segments  # the world's: big return values in shared memory (or None)
        self.recorder = recorder
        if self.blob is not None:
            self.session.world.send(self.ranks, self.blob)
            self.blob = None  # the kernel keeps no copy of what it sent

    def stop(self) -> None:
        """The first failure (or Ctrl-C, or the timeout): every rank still running it comes back to idle. The
        start's own run has no state to keep: its ranks end (SIGTERM), as a one-shot launch's do."""
        if not self.req_id:
            self.session.world.group.signal_all(signal.SIGTERM)
            return
        if self.signalled_at is None:
            running = self._running()
            self.asked = {w.rank for w in running} - set(self._control("where", running))
            self._interrupt()

    def observe(self, observers) -> None:
        observers.watch(self.on_event, kinds=("where", "waiting", "idle"))
        observers.watch(self.relay.on_done, kinds=("done",))  # the ranks' agreement on sharded values

    def on_event(self, rank: int, kind: str, payload) -> None:
        """What this request watches: where a stopped rank was; a rank waiting long in a collective; a rank
        back at idle (the process-group generation and collective count it came back with)."""
        if kind == "idle":
            self.idle[rank] = payload
        elif kind == "where" and payload.get("cell") == self.req_id:
            self.answered.add(rank)
            if not payload.get("done"):
                self.where[rank] = payload
        elif kind == "waiting":
            self.waiting[rank] = payload
            self._check_mismatch()

    def poll(self, recorder, wait_s: float) -> bool:
        if self.loop is None:
            self.loop = EventLoop(
                self.session.world.group,
                recorder,
                until=lambda: self._over(recorder),
                mux=self.session.world.mux,
            )
        return self.loop.poll(wait_s)

    def on_interrupt(self, again: bool) -> None:
        if again:
            self.given_up = True

    def interrupt_error(self, recorder) -> BaseException:
        back = self._all_back(recorder) and self._broken(recorder) is None
        where = self._where_lines()
        if where:
            self.session.err.write("nblaunch: " + "; ".join(where) + "\n")
        if not back:
            return CellInterrupted("the cell was interrupted")
        # what still holds the old group after a rebuild (a new_group, FSDP) fails at its next use: said here
        after = "".join(f"\nnblaunch: after the rebuild, {n}." for n in self.rebuild_notes if self.rebuilt is not None)
        return CellInterrupted("every rank stopped the cell and kept its state" + after)

    def close(self, grace: float, recorder) -> None:
        """Judge whether the world can go on (``verdict``) and say it in the run's error; the session acts on
        it. (Not for the start's own run: ranks that cannot come up are the session's, ``LiveSession._bring_up``.)"""
        if self.loop is not None:
            self.loop.finish()
        self.relay.forget()
        if not self.req_id:
            return
        if recorder.report.state is not RunState.INTERRUPTED and not self.mismatch:
            where = self._where_lines()
            if where:
                recorder.note("Where the other ranks were: " + "; ".join(where) + ".")
        self.verdict = self._judge(recorder)
        if self.verdict.fate is WorldFate.REBUILT:
            for n in self.rebuild_notes:
                recorder.note(f"nblaunch: after the rebuild, {n}.")
            recorder.note(f"nblaunch: {REBUILT}.")
        elif self.verdict.fate is WorldFate.KEPT and recorder.report.failures:
            recorder.note(f"nblaunch: {KEPT}.")  # the failure came before any peer waited for it
        if not self.verdict.loses_state or self.session.runs.stop_asked.is_set():
            return  # (Stop from the launch panel: the session closes the world next, no restart)
        then = RESTARTED if self.verdict.restarts else REPLACING
        message = f"nblaunch: {self.verdict.reason}; {then}."
        if self.verdict.fate is WorldFate.REPLACE and recorder.report.state is not RunState.INTERRUPTED:
            self.session.err.write(message + "\n")  # said now: the replacement takes seconds before the error shows
            self.session.err.flush()
        if recorder.report.state is RunState.INTERRUPTED:
            self.session.err.write(message + "\n")
            self.session.err.flush()
            recorder.report.notes.append(message)
        elif not recorder.report.failures:
            recorder.engine_failed(f"{self.verdict.reason}; {then}.")
        else:
            recorder.note(message)

    def _judge(self, recorder) -> Verdict:
        world = self.session.world
        lost = [w for w in world.group.workers if world.group.poll(w) is not None]
        if lost and world.replaces_lost and not self.given_up and not self._stuck(recorder):
            return Verdict(WorldFate.REPLACE, world.lost_words(lost), tuple(w.rank for w in lost))
        reason = self._broken(recorder)
        if reason is not None:
            return Verdict(WorldFate.RESTART, reason)
        return Verdict(WorldFate.REBUILT) if self.rebuilt is not None else KEPT_WORLD

    # -- inside ----------------------------------------------------------------------------
    def _over(self, recorder) -> bool:
        """The loop's end: every rank back to idle, then (after an abort, or ranks out of step) the group rebuilt."""
        self._say_awaited(recorder)
        if self.rebuilding is not None:
            return self._rebuilt(recorder, self.rebuilding)
        return self._all_back(recorder) and not self._rebuild_if_needed(recorder)

    def _alive(self):
        return [w for w in self.session.world.group.workers if w.status is None]

    def _running(self):
        return [w for w in self._alive() if w.rank in self.ranks and not self._back(w.rank)]

    def _control(self, kind: str, workers) -> list[int]:
        """A control message (``where``, ``abort``) to these ranks, whose reader thread answers it; the ranks
        it could not reach."""
        return self.session.world.send_control(tuple(w.rank for w in workers), pickle.dumps({"kind": kind}, protocol=5))

    def _interrupt(self) -> None:
        self.signalled_at = time.monotonic()
        self.session.world.interrupt(self._running())

    def _back(self, rank: int) -> bool:
        return self.recorder is not None and self.recorder.rank_state(rank) is RankState.IDLE

    def _all_back(self, recorder) -> bool:
        """The loop's end condition; while stopping, it repeats the interrupt and, past ABORT_AFTER_S, aborts."""
        running = self._running()
        if running and self.signalled_at is not None:
            waited = time.monotonic() - self.signalled_at
            if waited >= ABORT_AFTER_S and not self.aborted and self.session.plan.num_processes > 1:
                self.aborted = True
                self._control("abort", self._alive())  # every rank: one rank's sockets reach only its neighbours
            if waited >= RESIGNAL_S:
                self._interrupt()
        elif running and self.waiting:
            self._check_mismatch()
        if not running and self.signalled_at is not None and time.monotonic() - self.signalled_at < WHERE_WAIT_S:
            # a rank's answer (from its reader thread) may come after its idle: wait for it a moment
            return self.asked <= self.answered | {w.rank for w in self.session.world.group.workers if w.status}
        return not running

    def _check_mismatch(self) -> None:
        """Ranks that will never meet in their collectives are the failure, named now, not at a timeout."""
        rec = self.recorder
        if rec is None or rec.stopping:
            return
        running = self._running()
        if not running or any(w.rank not in self.waiting for w in running):
            return
        calls = {w.rank: self.waiting[w.rank] for w in running}
        finished = [r for r in self.ranks if self._back(r)]
        keys = {(c["collective"], c["seq"]) for c in calls.values()}
        if not finished and len(keys) == 1:
            return  # every rank waits in the same collective: slow, not stuck
        what = "; ".join(place_line(r, c["line"], collective=c["collective"], seq=c["seq"]) for r, c in calls.items())
        ended = {r: self.idle.get(r, {}) for r in finished}  # their idle: the collective count they ended at
        if finished:
            names = ", ".join(map(str, finished))
            counts = ", ".join(f"rank {r} at collective #{i.get('seq')}" for r, i in ended.items())
            message = f"{what}, which rank(s) {names} never joined: they finished the cell ({counts})"
        else:
            message = f"the ranks called different collectives, which can never complete: {what}"
        groups = {r: c.get("group") for r, c in calls.items()} | {r: i.get("group") for r, i in ended.items()}
        if len(set(groups.values())) > 1:  # never meant to happen: the rebuild puts every rank on the same group
            on = ", ".join(f"rank {r} on #{g}" for r, g in sorted(groups.items()))
            message += f"; the ranks are on different process groups ({on}): %distributed_restart makes them again"
        self.mismatch = True
        rec.engine_failed(message)

    def _rebuild_if_needed(self, recorder) -> bool:
        """After an abort, or with ranks out of step, every rank makes the default group again, in place: sent
        here, waited for by the loop (``_over``). True when it was sent."""
        if self.req_id == 0 or self.session.plan.num_processes < 2 or self._running():
            return False
        alive = self._alive()
        if len(alive) < self.session.plan.num_processes:
            return False  # a rank is gone: the world is restarted instead
        seqs = {self.idle.get(w.rank, {}).get("seq") for w in alive if w.rank in self.idle}
        if not self.aborted and len(seqs) <= 1:
            return False
        gen = self.session.world.next_generation()
        body = pickle.dumps({"kind": "rebuild", "id": self.req_id, "gen": gen}, protocol=5)
        self.session.world.send(tuple(w.rank for w in alive), body)
        self.rebuilding = gen
        return True

    def _awaited(self, recorder) -> list[int]:
        """The live ranks this request still waits for: not back to idle, or (rebuilding) not on the new group."""
        if self.rebuilding is not None:
            return [w.rank for w in self._alive() if self.idle.get(w.rank, {}).get("group") != self.rebuilding]
        return [w.rank for w in self._running()]

    def _say_awaited(self, recorder) -> None:
        """Once, ``SETTLE_S`` into a stop: what failed, which rank the cell still waits for and where, and what ■
        again does. The wait goes on: every rank process is alive, and its state is kept."""
        since = recorder.stopping_since
        if self.awaited_said or not self.req_id or since is None or time.monotonic() - since < SETTLE_S:
            return
        awaited = self._awaited(recorder)
        if not awaited:
            return
        self.awaited_said = True
        root = recorder.report.root_cause()
        what = (
            f"rank {root.rank} failed ({first_line(root.message)})"
            if root is not None and root.rank is not None
            else first_line(root.message)
            if root is not None
            else "the cell was interrupted (■)"
        )
        where = self._where_by_rank()
        names = ", ".join(map(str, awaited))
        doing = "rebuild the process group" if self.rebuilding is not None else "come back to idle"
        at = "; ".join(where[r] for r in awaited if r in where)
        self.session.err.write(
            f"nblaunch: {what}. Still waiting for rank(s) {names} to {doing}{f' ({at})' if at else ''}: every rank "
            "keeps its state meanwhile. Press ■ again to stop waiting; the live session is then restarted and its "
            "state is lost.\n"
        )
        self.session.err.flush()

    def _rebuilt(self, recorder, gen: int) -> bool:
        """Every rank came back with group ``gen`` (then ``rebuilt`` is set), or a rank ended."""
        workers = self.session.world.group.workers
        if any(w.status is not None for w in workers):
            return True
        if not all(self.idle.get(w.rank, {}).get("group") == gen for w in workers):
            return False
        if not any(self.idle[w.rank].get("rebuild_failed") for w in workers):
            self.rebuilt = gen
            self.rebuild_notes = sorted({n for w in workers for n in self.idle[w.rank].get("notes", ())})
        return True

    def _stuck(self, recorder, *, alive_only: bool = True) -> list[int]:
        """The ranks of this request not back to idle (of those alive, unless said)."""
        return [
            w.rank
            for w in self.session.world.group.workers
            if w.rank in self.ranks
            and not (alive_only and w.status is not None)
            and recorder.rank_state(w.rank) is not RankState.IDLE
        ]

    def _where_lines(self) -> list[str]:
        return list(self._where_by_rank().values())

    def _where_by_rank(self) -> dict[int, str]:
        """Each stopped rank's place ("rank 1: cell In[3], line 2, calling sleep()", ``rank_place``), but the root
        cause's."""
        lines = {}
        for rank in sorted(self.where):
            w = self.where[rank]
            root = self.recorder.report.root_cause() if self.recorder is not None else None
            if root is not None and root.rank == rank:
                continue  # the root cause: its own traceback says where it was
            if w.get("line") is None and w.get("seq") is None:
                lines[rank] = f"rank {rank}: had not started the cell"
                continue
            at = w.get("line") or "not in the cell's code (starting or ending it)"
            detail = {k: w.get(k) for k in ("collective", "seq", "inside", "calling")}
            lines[rank] = place_line(rank, at, **detail)
        return lines

    def _broken(self, recorder) -> str | None:
        workers = self.session.world.group.workers
        dead = [w for w in workers if self.session.world.group.poll(w) is not None]
        if dead:
            return "; ".join(f"rank {w.rank} (pid {w.pid}) ended: {w.status.describe()}" for w in dead)
        stuck = self._stuck(recorder, alive_only=False)
        if stuck:
            names = ", ".join(map(str, stuck))
            why = "■ was pressed again while " if self.given_up else ""
            return (
                f"{why}rank(s) {names} had not come back to idle (a C-level wait outside the process group, or "
                "code holding the GIL), so the wait was given up"
            )
        if self.aborted and self.rebuilt is None:
            if self.given_up and self.rebuilding is not None:
                return "■ was pressed again while the ranks were rebuilding the process group, so the wait was given up"
            return "the process group could not be rebuilt in the same processes"
        if self.rebuilt is None and set(self.ranks) == {w.rank for w in workers}:
            seqs = {r: self.idle[r].get("seq") for r in self.ranks}
            if None not in seqs.values() and len(set(seqs.values())) > 1:
                counts = ", ".join(f"rank {r}: {s}" for r, s in sorted(seqs.items()))
                return (
                    f"the ranks ran different numbers of collectives ({counts}), so their next collective would "
                    "pair up wrong calls"
                )
        return None
