"""A live session as one entry of the launch panel's Runs view, for its whole life.

The session's run folder (the one its rank logs are in, locked while the session lives) holds a
``state.json`` written by ``LiveRunEntry``: state ``starting`` → ``idle`` between cells,
``running`` during one (after its first ``SHOW_RUNNING_AFTER_S``), and at the end ``done``
(``%distributed_stop``), ``stopped`` (Stop from the panel between cells) or ``failed`` (the ranks
never came up); the count of cells run, and every rank with its pid and pid start time (the
server's identity check before it samples a pid), ``idle`` / ``busy`` / ``dead``. A restart
gives new pids and the entry says so at once.

Stop comes over the run's ``control.sock`` (``launch.run_control``), served by a small daemon
thread of the session, so it answers between cells too, when nothing runs in the kernel's main
thread. The thread never touches the ranks while a cell runs: it only raises a flag, which the
cell's kernel loop (the recorder's ``tick``, in the main thread) turns into that cell's Stop, the
way ■ stops it: every rank comes back to idle with its state (its group rebuilt if one waited in a
collective), the cell raises ``LaunchStoppedError``, and the session goes on. Between
cells the thread takes the session's life lock (``LiveSession.life``: every main-thread request
holds it, so no cell can start meanwhile) and stops the session itself; the next
``%%distributed`` cell then refuses once, saying the session was stopped from the panel, and
later cells run one-shot. Nothing here signals a process the session did not start.

Example::

    >>> entry = LiveRunEntry(session)         # doctest: +SKIP  (state.json "starting", control.sock up)
    >>> entry.begin(engine); entry.tick(report); entry.end(engine, report)   # doctest: +SKIP  one cell
    >>> entry.close(RunState.DONE)                    # doctest: +SKIP  final state, socket removed
"""

from __future__ import annotations

import os
import selectors
import threading
import time

from ..debugger.undebugged import undebugged
from ..engines.local_group import close_quietly
from ..launch import rank_stacks
from ..launch.recorder import live_rank_state
from ..launch.run_control import RunControl
from ..launch.run_state import RunStateWriter, root_cause_line
from ..launch.run_tracker import RunTracker
from ..run_contract import FINAL_RUN_STATES, RunState, rank_log_name, stop_place_words
from ..short_traceback import error_line


def engine_words(engine: str) -> str:
    """How a live session's entry names its engine: 'local (live)', 'ray (live)'."""
    return f"{engine} (live)"


def panel_stopped(place: str | None = None) -> str:
    """The session stopped by Stop between cells, naming where it was pressed (``run_contract.STOP_PLACES``)."""
    return (
        f"nblaunch: the live session was stopped from {stop_place_words(place)} (Stop): its ranks and their state "
        "are gone and nothing is left running."
    )


PANEL_STOPPED = panel_stopped()
NEXT_CELL = "The next %%distributed cell runs one-shot; start a new live session with %distributed_start."


def cell_stopped(place: str | None = None) -> str:
    """A live cell stopped by Stop (every rank kept its state), naming where Stop was pressed."""
    return f"the cell was stopped from {stop_place_words(place)} (Stop)"


CELL_STOPPED = cell_stopped()
CELL_STOP_REPLY = (
    "stopping the running cell: every rank comes back to idle with its state; Stop between cells ends the live session"
)
PENDING_WRITE_S = 0.25  # the idle state after a cell is in state.json this long after the cell at most
SHOW_RUNNING_AFTER_S = 0.25  # a request shorter than this goes from idle to idle in state.json (one write)
STOP_REPLY = "stopping the live session: its ranks get SIGTERM now, SIGKILL after a short grace"


class LiveRunEntry(RunTracker):
    """The session's ``state.json`` and its Stop channel; see the module docstring.

    To the recorder it is a run's tracker like any other (``tick``); its Stop channel is not the kernel
    loop's to serve (``RunTracker.attach`` sees no control) but its own thread's, between cells too."""

    def __init__(self, session):
        self.session = session
        try:
            self.channel = RunControl.listen(session.log_dir)
        except OSError:  # a log_dir on a file system without sockets: the session goes on, without Stop
            self.channel = None
        if self.channel is not None:
            self.channel.stopping_message = STOP_REPLY
        engine = engine_words(session.plan.engine)
        super().__init__(RunStateWriter(session.log_dir, engine=engine, has_control=self.channel is not None), None)
        self.write_lock = threading.Lock()  # the daemon thread and the main thread both write
        self.stop_asked = threading.Event()  # Stop between cells: the session ends
        self.cell_stop = threading.Event()  # Stop during a cell: that cell stops, every rank keeps its state
        self.stop_place: str | None = None  # where the last Stop was pressed (the words after it name it)
        self.cells = 0
        self.engine = None  # the request running now (a LiveRunEngine), None between requests
        self.begun = 0.0  # when it started (time.monotonic())
        self.last_cell: str | None = None  # the last cell's outcome: ok, failed, interrupted...
        self.ended = False
        self._pending: dict | None = None  # a snapshot for the thread to write (``_write(later=True)``)
        self._write(RunState.STARTING)
        self.thread = None
        if self.channel is not None:
            self._quit_r, self._quit_w = _pipe()
            self.thread = undebugged(threading.Thread(target=self._serve, name="nblaunch-live-control", daemon=True))
            self.thread.start()

    # -- what the session tells ------------------------------------------------------------
    def begin(self, engine) -> None:
        """A request starts on the ranks (main thread, holding the session's life lock). A cell is written as
        ``running`` only once it has run ``SHOW_RUNNING_AFTER_S`` (``tick``): most cells are over sooner, and
        a view polling the file would not have seen the state anyway."""
        self.engine = engine
        self.begun = time.monotonic()
        self.cell_stop.clear()  # (a Stop that came as the request before ended: that one is over)
        if engine.req_id == 0:
            self._write(RunState.STARTING)

    def tick(self, report) -> None:
        """The recorder's tick during a request: a Stop asked from the panel becomes the cell's Stop here."""
        rec = getattr(self.engine, "recorder", None)
        if rec is not None and not rec.stopping:
            if self.stop_asked.is_set():  # (it came as this request began: the session ends after it)
                if rec.stop_requested():
                    rec.note(self.stopped_words().removeprefix("nblaunch: ") + " " + NEXT_CELL)
            elif self.cell_stop.is_set():  # the cell stops as after ■: every rank back to idle, state kept
                rec.stop_requested(cell_stopped(self.stop_place), grace_s=None)
        if self.engine is None or self.engine.req_id == 0:
            self._write(RunState.STARTING, throttle=True)
        elif time.monotonic() - self.begun >= SHOW_RUNNING_AFTER_S:
            self._write(RunState.RUNNING, throttle=True)

    def end(self, engine, report, is_cell: bool) -> None:
        """The request is over (whatever its outcome): back to idle, or the end if the world is gone."""
        self.engine = None
        if is_cell:
            self.cells += 1
            self.last_cell = report.outcome if report is not None else None
        if not self.ended and not self.stop_asked.is_set():  # (stopped: the final state follows at once)
            self._write(RunState.IDLE, later=engine.req_id != 0)  # (the start's own end: at once, ready means idle)

    def restarted(self) -> None:
        """New processes (same flags): the entry shows their pids at once."""
        self._write(RunState.STARTING)

    def close(self, state: RunState, error: BaseException | None = None) -> None:
        """The session ended: ``done``, ``stopped`` or ``failed``; the socket goes first, then the final state."""
        if self.ended:
            return
        self.ended = True
        if self.thread is not None and threading.current_thread() is not self.thread:
            _write_byte(self._quit_w)
            self.thread.join(5)
        if self.channel is not None:
            self.channel.close()
        rank_stacks.remove_files(self.session.log_dir)
        self._write(state, final=True, error=error)

    # -- the Stop channel's thread ---------------------------------------------------------
    def _serve(self) -> None:
        sel = selectors.DefaultSelector()
        try:
            self.channel.register(sel, self._on_stop, self._stack_targets)
            sel.register(self._quit_r, selectors.EVENT_READ, (None, "quit"))
            while not self.ended:
                for key, _ in sel.select(0.05 if self.stop_asked.is_set() else PENDING_WRITE_S):
                    if key.data[1] == "quit":
                        return
                    if key.fd in sel.get_map():
                        key.data[0].on_ready(key.fd)
                self._write_pending()
                if self.stop_asked.is_set() and not self.ended:
                    self._stop_between_cells()
        finally:
            sel.close()
            close_quietly(self._quit_r, self._quit_w)

    def _write_pending(self) -> None:
        if self._pending is None:
            return
        with self.write_lock:
            snap, self._pending = self._pending, None
            if snap is not None:
                self.writer.write(snap)

    def _stack_targets(self) -> list:
        """The live ranks to ask for stacks, between cells too; none while the world is being replaced."""
        world = self.session.world
        group = getattr(world, "group", None) if world is not None and not self.ended else None
        if group is None or getattr(group, "closed", False):
            return []
        return [(w.rank, w.pid, w.status.describe() if w.status else None) for w in group.workers]

    def ended_words(self, state: RunState, error: BaseException | None) -> str:
        """The start cell's last status line ('session stopped from the run's dashboard; nothing is left running')."""
        how = "by an error" if error is not None else ""
        if state is RunState.STOPPED:
            how = f"from {stop_place_words(self.stop_place)}"
        return f"session stopped {how}".rstrip() + "; nothing is left running"

    def stopped_words(self) -> str:
        """'nblaunch: the live session was stopped from the run's dashboard (Stop): …'"""
        return panel_stopped(self.stop_place)

    def _on_stop(self, place: str | None = None) -> bool | str:
        """From the control socket: during a cell, stop that cell (the reply says so); between cells, the
        session (True). False: a stop is under way already. ``place``: where Stop was pressed."""
        if self.stop_asked.is_set() or self.ended:
            return False
        self.stop_place = place
        engine = self.engine
        if engine is not None and engine.req_id != 0:  # the main thread's tick turns it into the cell's Stop
            if self.cell_stop.is_set():
                return False
            self.cell_stop.set()
            return CELL_STOP_REPLY
        self.stop_asked.set()  # first: a request starting now sees it at its next loop turn
        return True

    def _stop_between_cells(self) -> None:
        # The life lock: a request running now holds it and stops the session itself once it sees the flag
        # (never wait for it here: that request's end joins this thread); one about to start waits, then
        # finds the session stopped and refuses.
        if not self.session.life.acquire(blocking=False):
            return
        try:
            if not self.ended:
                self.session.stop_from_panel()
        finally:
            self.session.life.release()

    # -- the state file --------------------------------------------------------------------
    def _write(self, state: RunState, *, throttle: bool = False, final: bool = False, error=None, later=False) -> None:
        """Write ``state.json`` now, or (``later``) let the Stop channel's thread write it within
        ``PENDING_WRITE_S``: the file's rename is a journal write that the end of a quick cell need not wait
        for. Either way in the order asked (a write now supersedes one pending)."""
        with self.write_lock:
            key = (state, self.cells, self.session.restarts, self._engine_key())
            if not self.writer.due(key, force=not throttle):
                return
            snap = self.snapshot(state, final=final, error=error)
            if later and self.thread is not None and self.thread.is_alive():
                self._pending = snap  # (no wake-up: waking a thread costs a quick cell more than the write)
                return
            self._pending = None  # (superseded)
            self.writer.write(snap)  # a disk error costs the view, not the session

    def _engine_key(self):
        rec = getattr(self.engine, "recorder", None)
        return None if rec is None else (rec.report.state, len(rec.report.failures), len(self.engine.idle))

    def snapshot(self, state: RunState, *, final: bool = False, error=None) -> dict:
        """The JSON-ready state of the session (``state``: starting | idle | running | done | stopped | failed)."""
        s = self.session
        out = self.writer.header()
        out.update(
            state=state,
            session=True,
            world_size=s.plan.num_processes,
            backend=s.plan.backend,
            # (a Ray world's ranks are the actors' own processes: no start method of ours)
            start_method=s.plan.start_method if s.plan.engine != "ray" else "Ray actors",
            cells_run=self.cells,
            restarts=s.restarts,
            last_cell=self.last_cell,
            ranks=self._ranks(state),
            root_cause=None,
        )
        if final:
            out["ended"] = time.time()
            if state is RunState.STOPPED:
                out["root_cause"] = self.stopped_words().removeprefix("nblaunch: ")
            elif error is not None:
                report = getattr(error, "report", None)
                out["root_cause"] = (root_cause_line(report) if report is not None else None) or error_line(error)
        return out

    def _ranks(self, state: RunState) -> list[dict]:
        world = self.session.world if self.session.world.started else None
        rec = getattr(self.engine, "recorder", None)
        in_request = {r.rank: r.state for r in rec.report.ranks} if rec is not None else {}
        rows = []
        for wk in world.group.workers if world is not None else ():
            pid = wk.pid or None
            rank_state = live_rank_state(
                process_ended=wk.status is not None,
                session_over=state in FINAL_RUN_STATES,
                starting=state is RunState.STARTING,
                in_request=in_request.get(wk.rank),
            )
            rows.append(
                {
                    "rank": wk.rank,
                    "pid": pid,
                    # a rank on another machine: its pid names nothing here, so the server must not sample it
                    "pid_start": self.writer.pid_start(pid) if wk.here else None,
                    "node": wk.node,
                    "state": rank_state,
                    "exit": wk.status.describe() if wk.status is not None else None,
                    "log": rank_log_name(wk.rank),
                    "gpu": None,
                }
            )
        return rows


def _pipe() -> tuple[int, int]:
    return os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)


def _write_byte(fd: int) -> None:
    try:
        os.write(fd, b"x")
    except OSError:
        pass
