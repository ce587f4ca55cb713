"""A live session: a world made once (``live.world``: processes, process group, restarts), then requests.

Every request — the start, a cell, a function call, a push — is one run of
``launch.runner.run_engine`` with a ``LiveRunEngine`` (``live.request_engine``): the same report,
output routing, widgets, RunRecorder, failure and interrupt rules as a one-shot launch. Its entry
in the launch panel's Runs view (``live.run_entry``) is the tracker that recorder feeds. A failed
request brings every rank back to idle with its state; only a world that cannot go on is restarted
with the same flags, and the error says so.

One session per kernel at a time (``current()``); a second kernel has its own. Requests run one at
a time, each holding the session's one lock (``life``), which the panel's Stop between cells takes too.

Example::

    >>> s = LiveSession.start({"num_processes": 2})            # doctest: +SKIP
    >>> s.run_function(lambda: rank * 2).value                   # doctest: +SKIP
    0
    >>> s.stop()                                                 # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import sys
import threading

from .. import interrupts
from ..debugger.kernel_proxy import for_engine as debugger_for_engine
from ..display.progress_view import render_mode
from ..errors import CellInterrupted, LaunchConfigError, LaunchError, WorkerError
from ..kernel_shell import call_in_kernel_thread, notebook_namespace
from ..launch.request import LaunchOutcome, LaunchRequest
from ..launch.run_dir import run_log_dir
from ..launch.runner import keeping_last_report, run_engine
from ..run_contract import RunState
from ..short_traceback import summary_line
from . import registry
from .names import NameSender
from .rejoin_engine import RejoinEngine
from .request import LiveRequest, one_request_at_a_time
from .request_engine import REPLACING, RESTARTED, LiveRunEngine
from .run_entry import NEXT_CELL, LiveRunEntry
from .world import Verdict, WorldFate, WorldState, world_plan
from .worlds import make_world

current = registry.current  # this kernel's live session, or None
STOPPED = "nblaunch: this live session was stopped; start a new one with %distributed_start."


class LiveSession:
    """Ranks that stay up across cells. Use ``start()``; every method runs in the kernel's main thread."""

    def __init__(self, arguments: dict, config: str | None, out, err):
        self.arguments, self.config, self.out, self.err = dict(arguments), config, out, err
        self.cfg, self.plan = world_plan(self.arguments, config, err)
        self.render = render_mode(self.plan.output)
        self.ids = itertools.count(1)
        self.logs = contextlib.ExitStack()
        self.log_dir = self.logs.enter_context(run_log_dir(self.plan.log_dir))
        self.world = make_world(self.plan, self.log_dir, out, err, render=self.render, namespace=notebook_namespace)
        self.names = NameSender()
        self.life = threading.RLock()  # held by every request; the panel's Stop between cells takes it too
        self.runs = LiveRunEntry(self)  # the session's entry in the launch panel's Runs view, and its Stop
        self.start_display = None  # the start cell's RunDisplay (widgets only), told when the session ends

    # -- life cycle ------------------------------------------------------------------------
    @classmethod
    @interrupts.deferring(interrupts.SESSION_NOT_STARTED)
    def start(cls, arguments: dict, config: str | None = None, *, out=None, err=None) -> LiveSession:
        """Start the ranks and return once every one is ready (its process group is up)."""
        registry.refuse_a_second()
        session = cls(arguments, config, out or sys.stdout, err or sys.stderr)
        try:
            for notice in session.plan.notices:
                session.out.write(notice + "\n")
            with session.life:
                session._new_names(session.world.start())
                engine = session._start_engine()
                session._execute(engine, LaunchRequest(fn=None), session.plan)
                session.world.ready()
            # the start cell's status line, told when the session ends (else it would say "2 ready" for ever)
            session.start_display = engine.recorder.observers.display if engine.recorder is not None else None
        except KeyboardInterrupt as e:
            session._close(RunState.FAILED, e)
            raise CellInterrupted(interrupts.SESSION_NOT_STARTED) from None
        except BaseException as e:
            session._close(RunState.FAILED, e)
            raise
        registry.set_current(session)
        return session

    @one_request_at_a_time
    def restart(self) -> None:
        """New processes with the same flags; every rank's state is gone. Returns once every new rank is ready;
        if they do not come up, the session is stopped and a LaunchError says why."""
        if not self.world.up:
            raise LaunchError(STOPPED)
        self.restart_world()
        self._bring_up("the live session was restarted, but its new ranks")

    def stop(self) -> None:
        """Stop every rank; nothing is left (processes, port, fds). Safe to call twice. ■ meanwhile ends the
        ranks' grace at once (SIGKILL); the stop itself always completes."""
        with interrupts.deferred(interrupts.SESSION_STOPPED, interrupts.SESSION_STOPPED), self.life:
            self._close(RunState.DONE)

    def stop_from_panel(self) -> None:
        """The launch panel's Stop (``run_entry``), holding the lock: every rank ends, the entry says "stopped".
        The session stays this kernel's until its next cell, which refuses once and says why."""
        self._close(RunState.STOPPED, forget=False)

    def _close(self, state: RunState, error: BaseException | None = None, *, forget: bool = True) -> None:
        if self.runs.stop_asked.is_set():
            state = RunState.STOPPED
        if self.world.up:
            self.world.close(1.0)
        self.runs.close(state, error)  # the ranks (now dead) are still listed in the final state
        self.logs.close()
        if forget and registry.current() is self:
            registry.set_current(None)
        display, self.start_display = self.start_display, None
        if display is not None:
            call_in_kernel_thread(functools.partial(display.session_ended, self.runs.ended_words(state, error)))

    def restart_world(self) -> None:
        """Called when the world cannot go on: the old ranks are gone at once, new ones start."""
        self._new_names(self.world.restart())
        self.runs.restarted()

    def _new_names(self, namespace: dict) -> None:
        inherited = namespace if self.plan.start_method == "fork" else None
        self.names = NameSender.for_new_ranks(inherited, folder=self.world.segments)

    def _start_engine(self) -> LiveRunEngine:
        engine = LiveRunEngine(self, 0, range(self.plan.num_processes), blob=None, timeout=None, label="live session")
        engine.defer_display = False  # the start cell shows the session's status line until the session ends
        return engine

    def _bring_up(self, what: str, cause: BaseException | None = None, lost: tuple[int, ...] = ()) -> None:
        """Wait for a restarted world's ranks to be ready (or, ``lost``: these ranks replaced in the world, the
        others rebuilding their group with them). If they fail, the session is stopped (a world that cannot start
        would fail every later cell the same way) and the error says so: a LaunchError, or ``cause`` (the cell's
        own error, whose root cause comes first) with that said at its end."""
        try:
            if lost:
                gen = self.world.replace(lost)
                self.names.rank_replaced()
                self.runs.restarted()
                kept = tuple(r for r in range(self.plan.num_processes) if r not in lost)
                engine = RejoinEngine(self, kept=kept, gen=gen)
            else:
                engine = self._start_engine()
            with keeping_last_report():  # %distributed_last stays the cell's report, not the start's
                self._execute(engine, LaunchRequest(fn=None), self.plan)
            self.world.ready()
        except BaseException as e:
            self._close(RunState.DONE)
            message = (
                f"nblaunch: {what} did not come up ({summary_line(e)}). "
                "The live session is stopped and nothing is left running; fix the cause, then %distributed_start."
            )
            if cause is not None and cause.args and isinstance(cause.args[0], str):
                cause.args = (f"{cause.args[0]}\n{message}", *cause.args[1:])
                raise cause from None
            if isinstance(e, KeyboardInterrupt):
                self.err.write(message + "\n")
                raise
            raise LaunchError(message) from e

    # -- requests --------------------------------------------------------------------------
    @one_request_at_a_time
    def run_cell(self, program, *, return_from=(0,), ranks=None, output=None, progress=None, timeout=None):
        """Run a prepared cell (``notebook.cell.CellProgram``) on the ranks; the LaunchOutcome."""
        self._ensure_world()
        values, assigned = self.names.for_cell(program, notebook_namespace())
        return self._request(
            LiveRequest(program, (), {}, values, assigned, return_from, ranks, output, progress, timeout)
        )

    @one_request_at_a_time
    def run_function(self, fn, args=(), kwargs=None, *, return_from=(0,), ranks=None, timeout=None):
        """Call ``fn(*args, **kwargs)`` on the ranks (its globals: each rank's namespace); the LaunchOutcome."""
        if not callable(fn):
            raise LaunchConfigError("function", fn, "a callable (a function defined in the notebook, say)")
        self._ensure_world()
        values = self.names.for_function(fn, notebook_namespace())
        request = LiveRequest(fn, tuple(args), dict(kwargs or {}), values, return_from=return_from, ranks=ranks)
        return self._request(dataclasses.replace(request, timeout=timeout))

    @one_request_at_a_time
    def push(self, names, source: dict | None = None) -> list[str]:
        """Send these kernel values (or ``source``'s) to every rank, as they are now, even if unchanged."""
        self._ensure_world()
        ns = notebook_namespace() if source is None else source
        values, owned = self.names.for_push(names, ns, given=source is not None)
        self._request(LiveRequest(None, values=values, assigned=owned))
        return sorted(values)

    def _ensure_world(self) -> None:
        if self.runs.stop_asked.is_set():  # stopped from the launch panel between cells: refuse, once
            self._close(RunState.STOPPED)
            raise LaunchError(f"{self.runs.stopped_words()} This cell did not run. {NEXT_CELL}")
        if not self.world.up:
            raise LaunchError(STOPPED)
        lost = self.world.lost()  # (a world that replaces lost ranks: gone since the last request ended)
        if lost and self.world.state is not WorldState.BROKEN:
            reason = f"{self.world.lost_words(lost)}, since the last cell"
            self.err.write(f"nblaunch: {reason}; {REPLACING}.\n")
            self.err.flush()
            self._act(Verdict(WorldFate.REPLACE, reason, tuple(w.rank for w in lost)))
        if self.world.state is WorldState.BROKEN:  # a request before this one could not reach the ranks whole
            reason = self.world.broken_because
            self.err.write(f"nblaunch: {reason}; {RESTARTED}.\n")
            self._act(Verdict(WorldFate.RESTART, reason), what="the live session was restarted, but its new ranks")

    def _request(self, request: LiveRequest):
        if request.fn is not None:  # (JupyterLab's debugger: this machine's ranks only)
            fn, unreached = debugger_for_engine(self.plan.engine, request.fn)
            if unreached:
                self.out.write(unreached + "\n")
                request = dataclasses.replace(request, fn=fn)
        try:
            ranks = request.chosen_ranks(self.plan.num_processes)
            req_id = next(self.ids)
            blob = request.message(req_id, self.plan.progress)
        except BaseException:
            self.names.drop_segments()  # nothing went
            raise
        for note in self.names.take_notes():
            self.err.write(note + "\n")
        plan = request.plan_for(self.plan, ranks)
        engine = LiveRunEngine(self, req_id, ranks, blob=blob, timeout=plan.timeout, label=request.label(req_id))
        engine.render = request.render(engine.render)
        del blob
        try:
            return self._run(engine, LaunchRequest(fn=request.fn, return_all=True), plan)
        except WorkerError as e:
            if e.rank is not None and not engine.verdict.loses_state:  # its rank still holds the failed frames
                e.post_mortem = functools.partial(self.post_mortem, e.rank, req_id)  # %debug (notebook.debug_magic)
            raise
        finally:
            self.names.drop_segments()  # every rank is back to idle (or gone): what they mapped stays theirs
            if engine.blob is None and not engine.verdict.loses_state:  # the ranks have the values now
                self.names.sent(request.values, request.assigned)

    def _run(self, engine: LiveRunEngine, req: LaunchRequest, plan) -> LaunchOutcome:
        """One request, with the world up before it and after it (a restart it called for included)."""
        try:
            try:
                outcome = self._execute(engine, req, plan)
            except BaseException as e:
                self._act(engine.verdict, cause=e)  # restarted: up (or said not to be) before the error
                raise
            self._act(engine.verdict)
        finally:
            if self.runs.stop_asked.is_set() and self.world.up:  # Stop from the panel during this request
                self._close(RunState.STOPPED)
        if self.runs.stop_asked.is_set():  # it came as the request ended: its outcome stands, the session is gone
            self.err.write(f"{self.runs.stopped_words()} {NEXT_CELL}\n")
        return outcome

    def _act(self, verdict: Verdict, cause=None, what: str = "the new ranks of that restart") -> None:
        """The one place the session acts on what a request left of the world: a world that cannot go on is
        restarted (new processes, same flags) and brought up; one kept or rebuilt goes on as it is. (Stop from
        the launch panel meanwhile: no restart, the session closes the world next.) Lost ranks of a world that
        replaces them get new processes in their places; the others keep their state."""
        if not verdict.loses_state or self.runs.stop_asked.is_set():
            return
        if verdict.fate is WorldFate.REPLACE:
            self._bring_up("the lost rank(s)' replacements", cause=cause, lost=verdict.lost)
            self.err.write(f"nblaunch: {self.world.placed_words(verdict.lost)}.\n")
            return
        self.restart_world()
        self._bring_up(what, cause=cause)

    def _execute(self, engine: LiveRunEngine, req: LaunchRequest, plan) -> LaunchOutcome:
        if engine.req_id:
            self.world.begin_request()
        self.runs.begin(engine)
        try:
            outcome = run_engine(engine, req, plan, self.log_dir, self.out, self.err, self.runs)
        finally:
            self.world.end_request()
            self.runs.end(engine, getattr(engine.recorder, "report", None), engine.req_id != 0 and req.fn is not None)
        if engine.req_id:
            for r in engine.ranks:
                self.world.cells_run[r] += 1
        return outcome

    @one_request_at_a_time
    def post_mortem(self, rank: int, of: int) -> None:
        """``%debug`` after cell ``of`` failed: pdb in ``rank``'s frame of it, answered in the cell; ``q`` returns."""
        self._ensure_world()
        with keeping_last_report():  # %distributed_last stays the failed cell's report
            self._request(LiveRequest(debug_of=of, ranks=(rank,)))

    # -- what it is ------------------------------------------------------------------------
    @property
    def restarts(self) -> int:
        return self.world.restarts

    def describe(self) -> str:
        return self.world.describe(self.arguments)

    def status(self) -> list[dict]:
        """Per rank: pid, idle/busy, cells run, memory (RSS bytes)."""
        return self.world.status()
