"""What the Runs view's REST API does, as a plain class: list this user's launches, show one
with its ranks, read a rank's log, and ask a run's kernel to stop it.

Runs are the ``run-<time>-…`` folders that every launch creates (owner-only) in
``$TMPDIR/nblaunch-<uid>/`` and in the ``log_dir`` of the ``nblaunch.yaml`` this server's
root sees. Each holds the ``state.json`` its kernel keeps up to date, the rank logs and, while the
run is live, its control socket: the layout, the schema and the states are
``kernelside/run_contract.py``'s, read here and written by the kernel. A run counts as live while
its kernel holds the folder's lock; a state file that says "running" without that lock belongs
to a kernel that died mid-run and is shown as ``lost``.

Stop is a request to the kernel that owns the run (through the control socket); this class
never signals a process. Ids and log names come from the client: anything but a run folder's
own name (``..``, a path, a symlink) is refused.

Example::

    >>> runs = RunFolders("/srv/notebooks")
    >>> [r["id"] for r in runs.list_runs()][:1]          # doctest: +SKIP
    ['run-20250101-120000-ab12cd34']
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

from kernelside import config
from kernelside.errors import LaunchConfigError, shown_value
from kernelside.run_contract import (
    DEFAULT_STOP_PLACE,
    LIVE_RUN_STATES,
    RUN_ID,
    STATE_FILE,
    STOP_PLACES,
    WRITTEN_RUN_STATES,
    RunState,
    rank_log_name,
    rank_log_times_name,
    runs_base,
)

from .errors import PanelRequestError
from .rank_history import RankHistory
from .rank_resources import RankSampler, reported_figures
from .run_curves import RunCurves
from .run_files import RunDir, RunFileError, private_base_problem
from .version_check import kernel_version_note, run_format_note

STOP_TIMEOUT_S = 3.0
STACKS_TIMEOUT_S = 0.9  # the kernel gives its ranks 0.5 s (kernelside/launch/rank_stacks.py): an answer within 1 s
MAX_STACKS_BYTES = 4 << 20
MAX_TAIL_LINES = 10000


class RunFolders:
    """The launches of this user on this machine, read from their run folders on each request."""

    def __init__(self, root_dir: str | os.PathLike):
        self.root = Path(root_dir).expanduser().resolve()
        self.sampler = RankSampler()
        self.history = RankHistory()
        self.curves = RunCurves()

    # -- where runs are -------------------------------------------------------------------

    def bases(self) -> list[str]:
        """The folders that hold run folders: the default one, and the config's ``log_dir`` if set; only those that
        are private (``private_dir.open_private_dir``: a real folder of this user's that no one else can write)."""
        return [b for b in self._candidate_bases() if os.path.isdir(b) and private_base_problem(b) is None]

    def _candidate_bases(self) -> list[str]:
        found = [runs_base(None)]
        try:
            log_dir = config.resolve_config(cwd=self.root).values.get("log_dir")
        except (LaunchConfigError, OSError, ValueError):
            log_dir = None  # a broken config file: the config form reports it; runs still list
        if log_dir:
            path = os.path.join(self.root, os.path.expanduser(log_dir))  # relative: as a kernel in the root sees it
            if os.path.realpath(path) not in map(os.path.realpath, found):
                found.append(path)
        return found

    def _find(self, run_id) -> str:
        if not isinstance(run_id, str) or not RUN_ID.fullmatch(run_id):
            raise PanelRequestError(400, f"{shown_value(run_id)} is not a run id (run-YYYYmmdd-HHMMSS-xxxxxxxx)")
        candidates = self._candidate_bases()
        problems = {b: private_base_problem(b) for b in candidates}
        usable = [b for b in candidates if problems[b] is None and os.path.isdir(b)]
        for base in usable:
            path = os.path.join(base, run_id)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
                raise PanelRequestError(403, f"refused: {path} is not a plain run folder (a symbolic link?)")
            return path
        refused = "".join(f" (refused: {b} {p})" for b, p in problems.items() if p)
        raise PanelRequestError(404, f"no run {run_id} in {', '.join(usable) or 'any run folder'}{refused}")

    # -- reading --------------------------------------------------------------------------

    def list_runs(self) -> list[dict]:
        """Every run, newest first, as the list shows it (no per-rank resources)."""
        runs = []
        for base in self.bases():
            with os.scandir(base) as entries:
                names = [e.name for e in entries if RUN_ID.fullmatch(e.name) and e.is_dir(follow_symlinks=False)]
            for name in names:
                try:
                    with RunDir.open(os.path.join(base, name)) as d:
                        runs.append(self._summary(d, d.read_json(STATE_FILE), d.in_use()))
                except RunFileError:
                    continue  # removed meanwhile, or not ours
        runs.sort(key=lambda r: (r["started"] or 0, r["id"]), reverse=True)
        return runs

    def run(self, run_id) -> dict:
        """One run with its ranks; live ranks proven to be this run's carry cpu_percent, rss_bytes (and GPU use),
        as this machine's ``/proc`` says or, for a rank on another machine, as the rank itself reported.

        ``history`` holds those figures over the run so far, as far as they were asked for (``RankHistory``).
        """
        with self._open(run_id) as d:
            state = d.read_json(STATE_FILE)
            summary = self._summary(d, state, d.in_use())
            if state and run_format_note(state):
                state = None  # another format: its ranks are not read either (summary["note"] says why)
            ranks = [dict(r) for r in (state or {}).get("ranks") or [] if isinstance(r, dict)]
            # ranks on other machines: what they said of themselves (rank_resources.reported_figures)
            reported = reported_figures(d, ranks, time.time()) if summary["live"] else {}
        if summary["live"]:
            for r in ranks:
                r.update(reported.get(r.get("rank"), {}))
            proven = {}
            for r in ranks:
                figures = self.sampler.sample(r.get("pid"), r.get("pid_start"))
                if figures is not None:
                    r.update(figures)
                    proven[r["pid"]] = r
            for pid, usage in self.sampler.gpu(set(proven)).items():
                proven[pid].update(usage)
            self.history.add(run_id, time.time(), ranks)
        self.sampler.forget_ended()
        summary.update(
            ranks=ranks, log_dir=d.path, report=(state or {}).get("report"), history=self.history.series(run_id)
        )
        return summary

    def series(self, run_id) -> dict:
        """The run's training curves and each rank's progress counts so far (``RunCurves.read``)."""
        with self._open(run_id) as d:
            try:
                curves = self.curves.read(d, run_id)
            except RunFileError as e:
                raise PanelRequestError(e.status, f"the curves of {run_id}: {e}") from None
        return {"id": run_id, **curves}

    def log(self, run_id, rank, *, tail=None, offset=None) -> dict:
        """Rank ``rank``'s log: its last ``tail`` lines (default 200), or the bytes from ``offset`` on."""
        rank = _non_negative("rank", rank)
        offset = None if offset is None else _non_negative("offset", offset)
        tail = 200 if tail is None else min(_non_negative("tail", tail), MAX_TAIL_LINES)
        with self._open(run_id) as d:
            state = d.read_json(STATE_FILE) or {}
            live = self._summary(d, state, d.in_use())["live"]
            try:
                got = d.read_log(rank_log_name(rank), tail=tail, offset=offset, times=rank_log_times_name(rank))
            except RunFileError as e:
                raise PanelRequestError(e.status, f"rank {rank} of {run_id}: {e}") from None
        return {"id": run_id, "rank": rank, "log": rank_log_name(rank), "live": live, **got}

    # -- Stop -----------------------------------------------------------------------------

    def stop(self, run_id, place=None) -> dict:
        """Ask the run's kernel to stop it. 409 with the reason if it has ended, has no owner, or takes no Stop.

        ``place``: where Stop was pressed (``STOP_PLACES``: dashboard, sidebar, panel), named by the words after it."""
        if place is not None and place not in STOP_PLACES:
            allowed = ", ".join(repr(p) for p in STOP_PLACES)
            raise PanelRequestError(400, f'"from" is {place!r}: Stop is pressed in one of {allowed} (or leave it out)')
        with self._open(run_id) as d:
            state = d.read_json(STATE_FILE)
            summary = self._summary(d, state, d.in_use())
            if summary["state"] == RunState.LOST:
                raise PanelRequestError(
                    409, f"{run_id} has no owner any more: {summary['root_cause']}; nothing was signalled"
                )
            if not summary["live"]:
                raise PanelRequestError(409, f"{run_id} has already ended ({summary['state']}): nothing to stop")
            if not state.get("control"):
                raise PanelRequestError(
                    409,
                    f"{run_id} runs on the {summary['engine']} engine, which takes no Stop from the panel: "
                    "interrupt its kernel (■) instead",
                )
            try:
                reply = d.request({"op": "stop", "from": place or DEFAULT_STOP_PLACE}, STOP_TIMEOUT_S)
            except RunFileError as e:
                raise PanelRequestError(e.status, f"cannot stop {run_id}: {e}") from None
        if not reply.get("ok"):
            raise PanelRequestError(409, f"{run_id}'s kernel refused Stop: {reply.get('message')}")
        return {"id": run_id, "stopping": True, "message": str(reply.get("message", ""))}

    # -- stacks ---------------------------------------------------------------------------

    def stacks(self, run_id) -> dict:
        """Every rank's current Python stack, asked of the run's kernel (which alone signals its ranks).

        ``{"id", "ranks": [{"rank", "answered", "frames", "collective", "where", "threads" | "reason"}]}``;
        409 with the reason when the run has ended, has no owner, or its engine takes no requests.
        """
        with self._open(run_id) as d:
            state = d.read_json(STATE_FILE)
            summary = self._summary(d, state, d.in_use())
            if not summary["live"]:
                raise PanelRequestError(409, f"{run_id} is not running ({summary['state']}): no stacks to show")
            if not state.get("control"):
                raise PanelRequestError(
                    409, f"{run_id} runs on the {summary['engine']} engine, which cannot show its ranks' stacks"
                )
            try:
                reply = d.request({"op": "stacks"}, STACKS_TIMEOUT_S, max_bytes=MAX_STACKS_BYTES)
            except RunFileError as e:
                raise PanelRequestError(e.status, f"cannot get {run_id}'s stacks: {e}") from None
        if not reply.get("ok") or not isinstance(reply.get("ranks"), list):
            raise PanelRequestError(409, f"{run_id}'s kernel gave no stacks: {reply.get('message')}")
        taken = reply.get("taken")  # when the kernel asked its ranks (wall clock), for "taken at 18:05:12"
        return {"id": run_id, "ranks": reply["ranks"], "taken": taken if isinstance(taken, (int, float)) else None}

    def _open(self, run_id) -> RunDir:
        path = self._find(run_id)
        try:
            return RunDir.open(path)
        except RunFileError as e:
            raise PanelRequestError(e.status, str(e)) from None

    def _summary(self, d: RunDir, state: dict | None, in_use: bool) -> dict:
        summary = _summary(d, state, in_use)
        notebook = summary["notebook_path"]
        if isinstance(notebook, str) and os.path.isabs(notebook):
            try:  # Jupyter names the notebook by its full path: shown relative to this server's root
                notebook = str(Path(notebook).relative_to(self.root))
            except ValueError:
                pass
        summary["notebook"] = notebook
        return summary


def _summary(d: RunDir, state: dict | None, in_use: bool) -> dict:
    """The fields every listing shows; state files are read, never trusted for paths or pids.

    A state file of another format is not read at all: the run is listed as unknown with a ``note``.
    """
    s = state or {}
    note = run_format_note(s) if state else None
    if note:
        s = {}
    status = RunState(s["state"]) if s.get("state") in WRITTEN_RUN_STATES else RunState.UNKNOWN
    root_cause = s.get("root_cause")
    live = status in LIVE_RUN_STATES and in_use
    if status in LIVE_RUN_STATES and not in_use:
        status = RunState.LOST
        root_cause = f"the kernel that ran this launch (pid {s.get('kernel_pid')}) ended before the run did"
    elapsed = s.get("elapsed_s")
    if live and isinstance(elapsed, (int, float)) and isinstance(s.get("updated_monotonic"), (int, float)):
        elapsed += max(0.0, time.monotonic() - s["updated_monotonic"])  # one machine: one monotonic clock
    started = s.get("started")
    if not isinstance(started, (int, float)):
        started = _started_from_name(os.path.basename(d.path))
    return {
        "id": os.path.basename(d.path),
        "state": status,
        "live": live,
        "started": started,
        "elapsed_s": elapsed if isinstance(elapsed, (int, float)) else None,
        "notebook": None,  # set by RunFolders._summary: notebook_path, relative to the root when inside it
        "notebook_path": s.get("notebook") if isinstance(s.get("notebook"), str) else None,
        "cell": s.get("cell") if isinstance(s.get("cell"), int) and not isinstance(s.get("cell"), bool) else None,
        "flags": s.get("flags") if isinstance(s.get("flags"), str) else None,
        "kernel_id": s.get("kernel_id"),
        "kernel_pid": s.get("kernel_pid"),
        "engine": s.get("engine"),
        "world_size": s.get("world_size"),
        "backend": s.get("backend"),
        "start_method": s.get("start_method"),
        "root_cause": root_cause,
        "can_stop": live and bool(s.get("control")),
        "session": s.get("session") is True,  # a live session: one entry for its whole life
        "cells_run": s.get("cells_run") if isinstance(s.get("cells_run"), int) else None,
        "restarts": s.get("restarts") if isinstance(s.get("restarts"), int) else None,
        "note": note or kernel_version_note(s),
    }


def _started_from_name(name: str) -> float | None:
    try:
        return time.mktime(time.strptime(name[4:19], "%Y%m%d-%H%M%S"))
    except ValueError:
        return None


def _non_negative(name: str, value) -> int:
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 18:  # '²'.isdigit() is True
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise PanelRequestError(
            400, f"{name} must be a whole number >= 0 (ASCII digits, at most 18), got {shown_value(value)}"
        )
    return value
