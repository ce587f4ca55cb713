"""A live session: the plan and the ranks made once, then one run of the kernel loop per cell.

The world is the local engine's (``engines.local.LocalEngine``: the same WorkerGroup, rendezvous
store and pipes as a one-shot launch) with live ranks (``worker.live_rank``) that wait for requests
instead of exiting. Each request — a cell, a function call, a push — goes through
``launch.runner.run_engine`` with a ``LiveRunEngine``: the same report, output routing, widgets,
RunRecorder, failure and interrupt rules. A world that cannot go on is restarted with the same flags.

One session per kernel at a time (``current()``); a second kernel has its own.

Example::

    >>> s = LiveSession.start({"num_processes": 2})            # doctest: +SKIP
    >>> s.run_function(lambda: rank * 2).value                   # doctest: +SKIP
    0
    >>> s.stop()                                                 # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import pickle
import sys
import threading
import time

import cloudpickle

from ..channel import EventReader, write_frame
from ..config import resolve_config
from ..display.progress_view import render_mode
from ..engines.local import LocalEngine
from ..errors import LaunchConfigError, LaunchError
from ..launch.recorder import live_rank_state
from ..launch.request import LaunchOutcome, LaunchRequest
from ..launch.run_dir import run_log_dir
from ..launch.runner import keeping_last_report, plan_for, run_engine
from ..run_contract import RankState
from . import registry
from .names import NameSender, dumps
from .request_engine import LiveRunEngine
from .run_entry import NEXT_CELL, PANEL_STOPPED, LiveRunEntry

current = registry.current  # this kernel's live session, or None


def _holding_life(method):
    """Run a request holding the session's life lock: the panel's Stop never closes the world under it."""

    def wrapper(self, *args, **kwargs):
        with self.life:
            return method(self, *args, **kwargs)

    wrapper.__name__, wrapper.__doc__, wrapper.__wrapped__ = method.__name__, method.__doc__, method
    return wrapper


def kernel_namespace() -> dict:
    """The notebook's namespace: IPython's user namespace, else ``__main__``'s."""
    ip_mod = sys.modules.get("IPython")
    shell = ip_mod.get_ipython() if ip_mod is not None else None
    return shell.user_ns if shell is not None else vars(sys.modules["__main__"])


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
        self.lock = threading.Lock()
        self.logs = contextlib.ExitStack()
        self.log_dir = self.logs.enter_context(run_log_dir(self.plan.log_dir))
        self.world: LocalEngine | None = None
        self.started_at = time.monotonic()
        self.restarts, self.busy, self.broken = 0, False, None
        self.bytes_written = 0  # every byte written to the ranks' request pipes (all ranks)
        self.life = threading.RLock()  # held by every request; the panel's Stop between cells takes it too
        self.runs = LiveRunEntry(self)  # the session's entry in the launch panel's Runs view, and its Stop
        self.start_display = None  # the start cell's RunDisplay (widgets only), told when the session ends

    # -- life cycle ------------------------------------------------------------------------
    @classmethod
    def start(cls, arguments: dict, config: str | None = None, *, out=None, err=None) -> LiveSession:
        """Start the ranks and return once every one is ready (its process group is up)."""
        running = registry.current()
        if running is not None and running.world is None:
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
                session._start_world()
                session._await_ready()
        except BaseException as e:
            session._close("failed", e)
            raise
        registry.set_current(session)
        return session

    @_holding_life
    def restart(self) -> None:
        """New processes with the same flags; every rank's state is gone. Returns once every new rank is ready;
        if they do not come up, the session is stopped and a LaunchError says why."""
        if self.world is None:
            raise LaunchError("nblaunch: this live session was stopped; start a new one with %distributed_start.")
        if not self.lock.acquire(blocking=False):
            raise LaunchError("nblaunch: the live session is running a cell (from another thread); restart it after.")
        try:
            self.restart_world()
            self._bring_up("the live session was restarted, but its new ranks")
        finally:
            self.lock.release()

    @_holding_life
    def stop(self) -> None:
        """Stop every rank; nothing is left (processes, port, fds). Safe to call twice."""
        self._close("done")
        if registry.current() is self:
            registry.set_current(None)

    def stop_from_panel(self) -> None:
        """The launch panel's Stop (``run_entry``), holding the life lock: every rank ends, the entry says "stopped"."""
        self._close("stopped")

    def _close(self, state: str, error: BaseException | None = None) -> None:
        if self.runs.stop_asked.is_set():
            state = "stopped"
        if self.world is not None:
            self.world.close(1.0, None)
        self.runs.close(state, error)  # the ranks (now dead) are still listed in the final state
        self.world = None
        self.logs.close()
        display, self.start_display = self.start_display, None
        # (only from the kernel's main thread: a widget message sent from the panel's Stop thread would open
        # sockets of that thread in the kernel, which outlive it)
        if display is not None and threading.current_thread() is threading.main_thread():
            how = "from the launch panel" if state == "stopped" else "by an error" if error is not None else ""
            display.session_ended(f"session stopped {how}".rstrip() + "; nothing is left running")

    def _start_world(self) -> None:
        fork = self.plan.start_method == "fork"
        ns = kernel_namespace() if fork else {}
        self.names = NameSender()
        if fork:
            self.names.seed(ns)
        req = LaunchRequest(fn=None)
        blob = None if fork else cloudpickle.dumps(None)
        world = LocalEngine(
            req, self.plan, self.log_dir, self.out, self.err, render=self.render, spawn_blob=blob, live_namespace=ns
        )
        world.prepare()
        self.world = world
        world.start_ranks()
        self.readers = [EventReader() for _ in world.group.workers]
        self.cells_run = [0] * len(world.group.workers)
        self.ready, self.broken = False, None

    def restart_world(self) -> None:
        """Called when the world cannot go on: the old ranks are gone at once, new ones start."""
        if self.world is not None:
            self.world.close(0.2, None)
        self.restarts += 1
        self._start_world()
        self.runs.restarted()

    def _ready_engine(self) -> LiveRunEngine:
        engine = LiveRunEngine(self, 0, range(self.plan.num_processes), blob=None, timeout=None, label="live session")
        engine.defer_display = False  # the start cell shows the session's status line until the session ends
        return engine

    def _await_ready(self) -> None:
        engine = self._ready_engine()
        self._run(engine, LaunchRequest(fn=None), self.plan)
        # the start cell's status line, told when the session ends (else it would say "2 ready" for ever)
        self.start_display = engine.recorder.display if engine.recorder is not None else None
        self.ready = True

    def _bring_up(self, what: str, cause: BaseException | None = None) -> None:
        """Wait for a restarted world's ranks to be ready (the lock is held). If they fail, the session is stopped
        (a world that cannot start would fail every later cell the same way) and the error says so: a LaunchError,
        or ``cause`` (the cell's own error, whose root cause comes first) with that said at its end."""
        try:
            with keeping_last_report():  # %distributed_last stays the cell's report, not the start's
                self._execute(self._ready_engine(), LaunchRequest(fn=None), self.plan)
            self.ready = True
        except BaseException as e:
            self.stop()
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
    @_holding_life
    def run_cell(self, program, *, return_from=(0,), ranks=None, output=None, progress=None, timeout=None):
        """Run a prepared cell (``notebook.cell.CellProgram``) on the ranks; the LaunchOutcome."""
        self._ensure_world()
        ns = kernel_namespace()
        values, assigned = self.names.for_cell(program, ns)
        return self._request(program, (), {}, values, assigned, return_from, ranks, output, progress, timeout)

    @_holding_life
    def run_function(self, fn, args=(), kwargs=None, *, return_from=(0,), ranks=None, timeout=None):
        """Call ``fn(*args, **kwargs)`` on the ranks (its globals: each rank's namespace); the LaunchOutcome."""
        if not callable(fn):
            raise LaunchConfigError("function", fn, "a callable (a function defined in the notebook, say)")
        self._ensure_world()
        ns = kernel_namespace()
        values = self.names.for_function(fn, ns)
        return self._request(fn, tuple(args), dict(kwargs or {}), values, (), return_from, ranks, None, None, timeout)

    @_holding_life
    def push(self, names, source: dict | None = None) -> list[str]:
        """Send these kernel values (or ``source``'s) to every rank, as they are now, even if unchanged."""
        self._ensure_world()
        ns = kernel_namespace() if source is None else source
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
            if registry.current() is self:
                registry.set_current(None)
            raise LaunchError(f"{PANEL_STOPPED} This cell did not run. {NEXT_CELL}")
        if self.world is None:
            raise LaunchError("nblaunch: this live session was stopped; start a new one with %distributed_start.")
        if self.broken:
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
                "fn": dumps(fn) if fn is not None else None,
                "args": dumps((args, kwargs)) if (args or kwargs) else None,
                "names": {name: v[0] for name, v in values.items()},
                "return_from": tuple(return_from),
                "progress": progress or self.plan.progress,
            }
            if fn is None:
                body["fn"] = dumps(tuple)  # a push runs nothing: the names are set, then the rank is idle again
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
            return self._run(engine, LaunchRequest(fn=fn, return_all=True), plan)
        finally:
            if engine.blob is None and engine.restart_reason is None:  # the ranks have the values now
                self.names.sent(values, assigned)

    def _run(self, engine: LiveRunEngine, req: LaunchRequest, plan) -> LaunchOutcome:
        if not self.lock.acquire(blocking=False):
            raise LaunchError("nblaunch: the live session is already running a cell (from another thread).")
        try:
            if not self.ready and engine.req_id != 0:  # a world restarted outside a run: its ranks first come up
                self._bring_up("the live session was restarted, but its new ranks")
            try:
                outcome = self._execute(engine, req, plan)
            except BaseException as e:
                if engine.restart_reason is not None:  # restarted by this run: up (or said not to be) before it ends
                    self._bring_up("the new ranks of that restart", cause=e)
                raise
            if engine.restart_reason is not None:
                self._bring_up("the new ranks of that restart")
            return outcome
        finally:
            self.lock.release()
            if self.runs.stop_asked.is_set():  # Stop from the panel during this request: the session ends too
                self._close("stopped")
                if registry.current() is self:
                    registry.set_current(None)
        if self.runs.stop_asked.is_set():  # it came as the request ended: its outcome stands, the session is gone
            self.err.write(f"{PANEL_STOPPED} {NEXT_CELL}\n")
        return outcome

    def _execute(self, engine: LiveRunEngine, req: LaunchRequest, plan) -> LaunchOutcome:
        self.busy = True
        self.runs.begin(engine)
        try:
            outcome = run_engine(engine, req, plan, self.log_dir, self.out, self.err, self.runs)
        finally:
            self.busy = False
            is_cell = engine.req_id != 0 and req.fn is not None
            self.runs.end(engine, getattr(engine.recorder, "report", None), is_cell)
        if engine.req_id:
            for r in engine.ranks:
                self.cells_run[r] += 1
        return outcome

    def send(self, ranks, blob: bytes) -> None:
        """Write one request to these ranks' request pipes (blocking: an idle rank reads it at once)."""
        try:
            for w in self.world.group.workers:
                if w.rank in ranks:
                    write_frame(w.pipes.requests_w, blob)
                    self.bytes_written += len(blob) + 8
        except BaseException as e:
            # a request cut in half leaves the rank's stream unreadable: this world cannot go on
            self.broken = f"sending the request failed ({type(e).__name__})"
            raise

    # -- what it is ------------------------------------------------------------------------
    def describe(self) -> str:
        flags = " ".join(f"{k}={v}" for k, v in self.arguments.items()) or "(defaults)"
        return (
            f"{self.plan.num_processes} ranks, {self.plan.backend}, {self.plan.start_method}; flags {flags}; "
            f"up {time.monotonic() - self.started_at:.0f}s"
        )

    def status(self) -> list[dict]:
        """Per rank: pid, idle/busy, cells run, memory (RSS bytes)."""
        rows, now = [], {"starting": not self.ready, "in_request": RankState.BUSY if self.busy else None}
        for w in self.world.group.workers if self.world else ():
            rows.append(
                {
                    "rank": w.rank,
                    "pid": w.pid,
                    "state": live_rank_state(process_ended=bool(w.status), session_over=False, **now),
                    "cells": self.cells_run[w.rank],
                    "rss": _rss(w.pid),
                }
            )
        return rows


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
