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
import os
import pickle
import sys
import threading
import time

from .. import interrupts
from ..config import resolve_config
from ..display.progress_view import render_mode
from ..errors import CellInterrupted, LaunchConfigError, LaunchError, WorkerError
from ..kernel_shell import kernel_io_loop, notebook_namespace
from ..launch.request import LaunchOutcome, LaunchRequest
from ..launch.run_dir import run_log_dir
from ..launch.runner import keeping_last_report, plan_for, run_engine
from . import registry
from .names import NameSender, dumps
from .request_engine import LiveRunEngine
from .run_entry import NEXT_CELL, PANEL_STOPPED, LiveRunEntry
from .world import World

current = registry.current  # this kernel's live session, or None
STOPPED = "nblaunch: this live session was stopped; start a new one with %distributed_start."


def _one_at_a_time(method):
    """Run a request holding the session's lock; a second thread gets a clear error instead of a wait.
    (The panel's Stop between cells holds it for a moment: then the request waits, and finds the session gone.)"""

    @functools.wraps(method)
    @interrupts.deferring(interrupts.REQUEST_NOT_SENT)
    def wrapper(self, *args, **kwargs):
        if not self.life.acquire(blocking=False):
            if not self.runs.stop_asked.is_set():
                raise LaunchError("nblaunch: the live session is already running a cell (from another thread).")
            self.life.acquire()
        try:
            return method(self, *args, **kwargs)
        finally:
            self.life.release()

    return wrapper


class LiveSession:
    """Ranks that stay up across cells. Use ``start()``; every method runs in the kernel's main thread."""

    def __init__(self, arguments: dict, config: str | None, out, err):
        self.arguments, self.config, self.out, self.err = dict(arguments), config, out, err
        self.cfg = resolve_config(self.arguments, config=config)
        for w in self.cfg.warnings:
            err.write(f"nblaunch: {w}\n")
        self.plan = plan_for(self.cfg)
        if self.plan.engine != "local":
            raise LaunchConfigError(
                "engine",
                self.plan.engine,
                None,
                message=f"a live session runs its ranks on this machine; engine={self.plan.engine!r} (from "
                f"{'num_machines' if self.plan.engine == 'elastic' else 'engine'}) is not supported for it. "
                "Use a one-shot %%distributed cell for that engine. Nothing was started.",
            )
        self.render = render_mode(self.plan.output)
        self.ids = itertools.count(1)
        self.logs = contextlib.ExitStack()
        self.log_dir = self.logs.enter_context(run_log_dir(self.plan.log_dir))
        self.world = World(self.plan, self.log_dir, out, err, render=self.render, namespace=notebook_namespace)
        self.names = NameSender()
        self.started_at = time.monotonic()
        self.life = threading.RLock()  # held by every request; the panel's Stop between cells takes it too
        self.runs = LiveRunEntry(self)  # the session's entry in the launch panel's Runs view, and its Stop
        self.start_display = None  # the start cell's RunDisplay (widgets only), told when the session ends

    # -- life cycle ------------------------------------------------------------------------
    @classmethod
    @interrupts.deferring(interrupts.SESSION_NOT_STARTED)
    def start(cls, arguments: dict, config: str | None = None, *, out=None, err=None) -> LiveSession:
        """Start the ranks and return once every one is ready (its process group is up)."""
        running = registry.current()
        if running is not None and not running.world.up:
            registry.set_current(None)  # stopped from the launch panel between cells
            running = None
        if running is not None:
            raise LaunchError(
                "nblaunch: a live session is already running in this kernel "
                f"({running.describe()}). Stop it first (%distributed_stop), or restart it (%distributed_restart)."
            )
        session = cls(arguments, config, out or sys.stdout, err or sys.stderr)
        try:
            for notice in session.plan.notices:
                session.out.write(notice + "\n")
            with session.life:
                session._new_names(session.world.start())
                engine = session._start_engine()
                session._execute(engine, LaunchRequest(fn=None), session.plan)
                session.world.state = "idle"
            # the start cell's status line, told when the session ends (else it would say "2 ready" for ever)
            session.start_display = engine.recorder.display if engine.recorder is not None else None
        except KeyboardInterrupt as e:
            session._close("failed", e)
            raise CellInterrupted(interrupts.SESSION_NOT_STARTED) from None
        except BaseException as e:
            session._close("failed", e)
            raise
        registry.set_current(session)
        return session

    @_one_at_a_time
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
            self._close("done")

    def stop_from_panel(self) -> None:
        """The launch panel's Stop (``run_entry``), holding the lock: every rank ends, the entry says "stopped".
        The session stays this kernel's until its next cell, which refuses once and says why."""
        self._close("stopped", forget=False)

    def _close(self, state: str, error: BaseException | None = None, *, forget: bool = True) -> None:
        if self.runs.stop_asked.is_set():
            state = "stopped"
        if self.world.up:
            self.world.close(1.0)
        self.runs.close(state, error)  # the ranks (now dead) are still listed in the final state
        self.logs.close()
        if forget and registry.current() is self:
            registry.set_current(None)
        display, self.start_display = self.start_display, None
        if display is not None:
            how = "from the launch panel" if state == "stopped" else "by an error" if error is not None else ""
            text = f"session stopped {how}".rstrip() + "; nothing is left running"
            _in_kernel_thread(functools.partial(display.session_ended, text))

    def restart_world(self) -> None:
        """Called when the world cannot go on: the old ranks are gone at once, new ones start."""
        self._new_names(self.world.restart())
        self.runs.restarted()

    def _new_names(self, namespace: dict) -> None:
        """What the new ranks hold of the kernel's names: what they inherited (fork), else nothing."""
        self.names = NameSender()
        if self.plan.start_method == "fork":
            self.names.seed(namespace)

    def _start_engine(self) -> LiveRunEngine:
        engine = LiveRunEngine(self, 0, range(self.plan.num_processes), blob=None, timeout=None, label="live session")
        engine.defer_display = False  # the start cell shows the session's status line until the session ends
        return engine

    def _bring_up(self, what: str, cause: BaseException | None = None) -> None:
        """Wait for a restarted world's ranks to be ready. If they fail, the session is stopped (a world that
        cannot start would fail every later cell the same way) and the error says so: a LaunchError, or
        ``cause`` (the cell's own error, whose root cause comes first) with that said at its end."""
        try:
            with keeping_last_report():  # %distributed_last stays the cell's report, not the start's
                self._execute(self._start_engine(), LaunchRequest(fn=None), self.plan)
            self.world.state = "idle"
        except BaseException as e:
            self._close("done")
            message = (
                f"nblaunch: {what} did not come up ({_summary(e)}). "
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
    @_one_at_a_time
    def run_cell(self, program, *, return_from=(0,), ranks=None, output=None, progress=None, timeout=None):
        """Run a prepared cell (``notebook.cell.CellProgram``) on the ranks; the LaunchOutcome."""
        self._ensure_world()
        ns = notebook_namespace()
        values, assigned = self.names.for_cell(program, ns)
        return self._request(program, (), {}, values, assigned, return_from, ranks, output, progress, timeout)

    @_one_at_a_time
    def run_function(self, fn, args=(), kwargs=None, *, return_from=(0,), ranks=None, timeout=None):
        """Call ``fn(*args, **kwargs)`` on the ranks (its globals: each rank's namespace); the LaunchOutcome."""
        if not callable(fn):
            raise LaunchConfigError("function", fn, "a callable (a function defined in the notebook, say)")
        self._ensure_world()
        ns = notebook_namespace()
        values = self.names.for_function(fn, ns)
        return self._request(fn, tuple(args), dict(kwargs or {}), values, (), return_from, ranks, None, None, timeout)

    @_one_at_a_time
    def push(self, names, source: dict | None = None) -> list[str]:
        """Send these kernel values (or ``source``'s) to every rank, as they are now, even if unchanged."""
        self._ensure_world()
        ns = notebook_namespace() if source is None else source
        missing = [n for n in names if n not in ns]
        if missing:
            raise LaunchConfigError(
                "%distributed_push", ",".join(missing), None, message=f"not defined in the notebook: {missing}"
            )
        values = self.names.collect(names, ns, force=True)
        owned = ()
        if source is not None:  # values given by the caller, not the notebook's: from now on the ranks' own
            values = {k: (blob, ("pushed",), None) for k, (blob, _key, _ref) in values.items()}
            owned = tuple(values)
        self._request(None, (), {}, values, owned, (), None, None, None, None)
        return sorted(values)

    def _ensure_world(self) -> None:
        if self.runs.stop_asked.is_set():  # stopped from the launch panel between cells: refuse, once
            self._close("stopped")
            raise LaunchError(f"{PANEL_STOPPED} This cell did not run. {NEXT_CELL}")
        if not self.world.up:
            raise LaunchError(STOPPED)
        if self.world.state == "broken":
            self.restart_world()

    def _request(self, fn, args, kwargs, values, assigned, return_from, ranks, output, progress, timeout):
        n = self.plan.num_processes
        ranks = tuple(range(n)) if ranks is None else tuple(sorted(set(ranks)))
        bad = [r for r in (*ranks, *return_from) if not 0 <= r < n]
        if bad:
            raise LaunchConfigError("--ranks", bad[0], f"a rank of this {n}-rank live session (0..{n - 1})")
        req_id = next(self.ids)
        try:
            body = {
                "kind": "run" if fn is not None else "push",
                "id": req_id,
                "fn": dumps(fn if fn is not None else tuple),  # a push runs nothing: the names are set, that's all
                "args": dumps((args, kwargs)) if (args or kwargs) else None,
                "names": {name: v[0] for name, v in values.items()},
                "return_from": tuple(return_from),
                "progress": progress or self.plan.progress,
            }
            blob = pickle.dumps(body, protocol=5)
        except Exception as e:
            raise LaunchConfigError(
                None, None, None, message=f"cannot send this to the live ranks: {type(e).__name__}: {e}. Nothing ran."
            ) from None
        del body
        if output is None:
            output = self.plan.output if (0 in ranks or self.plan.output != "rank0") else "all"
        plan = dataclasses.replace(
            self.plan, output=output, progress=progress or self.plan.progress, timeout=timeout or self.plan.timeout
        )
        label = f"live session, cell {req_id}" if fn is not None else "live session, push"
        engine = LiveRunEngine(self, req_id, ranks, blob=blob, timeout=plan.timeout, label=label)
        del blob
        try:
            return self._run(engine, LaunchRequest(fn=fn, return_all=True, on_event=engine.on_event), plan)
        except WorkerError as e:
            if e.rank is not None and engine.restart_reason is None:  # its rank still holds the failed frames
                e.post_mortem = functools.partial(self.post_mortem, e.rank, req_id)  # %debug (notebook.debug_magic)
            raise
        finally:
            if engine.blob is None and engine.restart_reason is None:  # the ranks have the values now
                self.names.sent(values, assigned)

    def _run(self, engine: LiveRunEngine, req: LaunchRequest, plan) -> LaunchOutcome:
        """One request, with the world up before it and after it (a restart during it included)."""
        try:
            if self.world.state == "starting":  # a world restarted outside a run: its ranks first come up
                self._bring_up("the live session was restarted, but its new ranks")
            try:
                outcome = self._execute(engine, req, plan)
            except BaseException as e:
                if engine.restart_reason is not None:  # restarted by this run: up (or said not to be) before it ends
                    self._bring_up("the new ranks of that restart", cause=e)
                raise
            if engine.restart_reason is not None:
                self._bring_up("the new ranks of that restart")
        finally:
            if self.runs.stop_asked.is_set() and self.world.up:  # Stop from the panel during this request
                self._close("stopped")
        if self.runs.stop_asked.is_set():  # it came as the request ended: its outcome stands, the session is gone
            self.err.write(f"{PANEL_STOPPED} {NEXT_CELL}\n")
        return outcome

    def _execute(self, engine: LiveRunEngine, req: LaunchRequest, plan) -> LaunchOutcome:
        if engine.req_id:
            self.world.state = "busy"
        self.runs.begin(engine)
        try:
            outcome = run_engine(engine, req, plan, self.log_dir, self.out, self.err, self.runs)
        finally:
            if self.world.state == "busy":
                self.world.state = "idle"
            self.runs.end(engine, getattr(engine.recorder, "report", None), engine.req_id != 0 and req.fn is not None)
        if engine.req_id:
            for r in engine.ranks:
                self.world.cells_run[r] += 1
        return outcome

    @_one_at_a_time
    def post_mortem(self, rank: int, of: int) -> None:
        """``%debug`` after cell ``of`` failed: pdb in ``rank``'s frame of it, answered in the cell; ``q`` returns."""
        self._ensure_world()
        req_id = next(self.ids)
        blob = pickle.dumps({"kind": "debug", "id": req_id, "of": of}, protocol=5)
        plan = dataclasses.replace(self.plan, output="all", timeout=None)
        engine = LiveRunEngine(
            self, req_id, (rank,), blob=blob, timeout=None, label=f"live session, %debug of cell {of}"
        )
        engine.render = "text"  # a pdb conversation with one rank: its lines in the cell, no status line or rank tabs
        with keeping_last_report():  # %distributed_last stays the failed cell's report
            self._run(engine, LaunchRequest(fn=None, on_event=engine.on_event), plan)

    def send(self, ranks, blob: bytes) -> None:
        """Write one request to these ranks (``World.send``)."""
        self.world.send(ranks, blob)

    # -- what it is ------------------------------------------------------------------------
    @property
    def restarts(self) -> int:
        return self.world.restarts

    def describe(self) -> str:
        flags = " ".join(f"{k}={v}" for k, v in self.arguments.items()) or "(defaults)"
        return (
            f"{self.plan.num_processes} ranks, {self.plan.backend}, {self.plan.start_method}; flags {flags}; "
            f"up {time.monotonic() - self.started_at:.0f}s"
        )

    def status(self) -> list[dict]:
        """Per rank: pid, idle/busy, cells run, memory (RSS bytes)."""
        if not self.world.up:
            return []
        return [
            {
                "rank": w.rank,
                "pid": w.pid,
                "state": self.world.rank_state(w),
                "cells": self.world.cells_run[w.rank],
                "rss": _rss(w.pid),
            }
            for w in self.world.group.workers
        ]


def _summary(e: BaseException) -> str:
    """The first line of an error; nblaunch's own without its type and prefix (they say it all)."""
    lines = str(e).strip().splitlines()
    first = lines[0] if lines else ""
    if first.startswith("nblaunch: "):
        return first[len("nblaunch: ") :]
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


def _rss(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return None


def _in_kernel_thread(fn) -> None:
    """Call ``fn`` (a widget update) in the kernel's main thread: now, or from the panel's Stop thread on the
    kernel's event loop, which runs it between cells at once. (A widget message sent from that thread itself
    would open sockets of the thread in the kernel, which outlive it.) Without a kernel loop, nothing shows
    widgets: nothing to do."""
    if threading.current_thread() is threading.main_thread():
        fn()
        return
    loop = kernel_io_loop()
    if loop is not None:
        loop.add_callback(fn)
