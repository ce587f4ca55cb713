"""The run's state as the launch panel reads it: ``state.json`` in the run's own folder.

The kernel that runs a launch writes a small JSON snapshot of its ``LaunchReport`` (state,
ranks with pid and pid start time, root-cause line, report figures at the end), replaced
atomically (temporary file + rename) so a reader sees the old or the new file, whole. It is
written at every change of state and otherwise at most every ``WRITE_EVERY_S`` (the elapsed
time and a sign of life): the workers never do any of this, so a rank is never slowed.

The file's name, schema and states are ``kernelside/run_contract.py``'s, which the server extension
(``jupyter_ext/runs.py``) reads by too; each rank's state is the one the run recorder decided.

Example::

    >>> w = RunStateWriter("/tmp/nblaunch-0/run-20250101-120000-ab12cd", engine="local")  # doctest: +SKIP
    >>> w.update(report)            # cheap when nothing changed: throttled       # doctest: +SKIP
    >>> w.update(report, final=True)  # the end: report figures, exit per rank      # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import sys
import time

from ..kernel_shell import running_cell_count, running_shell
from ..private_dir import replace_in, write_in
from ..run_contract import FORMAT_VERSION, STATE_FILE, RunState, proc_start_time
from ..short_traceback import error_line, first_line
from ..versions import installed_version

__all__ = ["FORMAT_VERSION", "STATE_FILE", "RunStateWriter", "kernel_identity", "proc_start_time", "run_state_of"]

WRITE_EVERY_S = 0.25
# changes that come in a burst (each of 8 ranks ready, then done) are written together: at most one write per
# CHANGE_GAP_S, the first at once; a change is on disk CHANGE_GAP_S after it at the latest (the loop turns every 0.1 s)
CHANGE_GAP_S = 0.1


def kernel_identity() -> dict:
    """Which notebook and kernel run this launch, as far as this process can tell.

    Jupyter sets ``JPY_SESSION_NAME`` (the notebook's path) in the kernels it starts; the
    kernel id is the name of ipykernel's connection file (``kernel-<id>.json``).

    Example::

        >>> kernel_identity()["kernel_pid"] == os.getpid()
        True
    """
    kernel_id = None
    app_mod = sys.modules.get("ipykernel.kernelapp")  # never imported here: a plain script has no kernel
    if app_mod is not None and app_mod.IPKernelApp.initialized():
        name = os.path.basename(app_mod.IPKernelApp.instance().connection_file or "")
        if name.startswith("kernel-") and name.endswith(".json"):
            kernel_id = name[len("kernel-") : -len(".json")]
    pid = os.getpid()
    return {
        "notebook": os.environ.get("JPY_SESSION_NAME") or None,
        **running_cell(),
        "kernel_id": kernel_id,
        "kernel_pid": pid,
        "kernel_pid_start": proc_start_time(pid),
    }


def running_cell() -> dict:
    """The notebook cell that started this launch: ``{"cell": its execution count, "flags": its magic line}``.

    The Runs dashboard shows both and scrolls to the cell by its count (the one a rank's traceback
    names, ``kernel_shell.py``). Outside a kernel (a script) both are None.

    Example::

        >>> running_cell()  # in the cell the notebook shows as [3]: %%distributed -n 2   # doctest: +SKIP
        {'cell': 3, 'flags': '-n 2'}
    """
    shell = running_shell()
    history = getattr(shell, "history_manager", None)
    if shell is None or history is None or not history.input_hist_raw:
        return {"cell": None, "flags": None}
    first = history.input_hist_raw[-1].lstrip().split("\n", 1)[0]  # the running cell is stored last
    flags = first.split(None, 1)[1].strip() if first.startswith("%%distributed") and " " in first else None
    return {"cell": running_cell_count(shell), "flags": flags}


def run_state_of(state: RunState, ranks: list) -> RunState:
    """The run's ``RunState`` as its state file says it: the recorder's, except that a run still RUNNING is
    STARTING until every rank runs user code.

    Example::

        >>> run_state_of(RunState.TIMEOUT, []), run_state_of(RunState.RUNNING, [])
        (<RunState.TIMEOUT: 'timeout'>, <RunState.STARTING: 'starting'>)
    """
    if state is not RunState.RUNNING:
        return state
    if ranks and all(r.ready_s is not None for r in ranks):
        return RunState.RUNNING
    return RunState.STARTING


def _exit_text(r, failed: dict) -> str | None:
    """The state file's ``exit`` of a rank: its failure's first line, else how its process ended."""
    if r.rank in failed:
        return failed[r.rank]
    return r.status.describe() if r.status is not None else None


def root_cause_line(report) -> str | None:
    """One line on why a run failed: 'rank 1 failed: ValueError: bad batch', or None."""
    root = report.root_cause()
    if root is None:
        return None
    first = first_line(root.message)
    return first if root.rank is None else f"rank {root.rank} failed: {first}"


class RunStateWriter:
    """Writes one run's ``state.json``: on a change (at once, or ``CHANGE_GAP_S`` after the last write when
    changes come in a burst), otherwise every ``WRITE_EVERY_S`` at most; the final state always at once."""

    def __init__(self, run_dir: str, *, engine: str, has_control: bool = False, gpus: dict | None = None):
        self.run_dir = run_dir
        self.path = os.path.join(run_dir, STATE_FILE)
        self._tmp = f".{STATE_FILE}.tmp"  # made beside it, inside the run folder (by its descriptor)
        self.base = {
            "version": FORMAT_VERSION,
            "nblaunch": installed_version(),  # the server names a kernel of another nblaunch (kernelside/versions.py)
            "id": os.path.basename(run_dir),
            "engine": engine,
            "control": has_control,
            **kernel_identity(),
        }
        self.gpus = gpus or {}  # rank -> the GPU it computes on (physical id), when on GPUs
        self.t0 = time.monotonic()
        self.started = time.time()
        self.last_write = float("-inf")
        self.last_key = None
        self.pid_starts: dict[int, int | None] = {}
        self.failed: OSError | None = None  # the first write that failed; later ones are not tried

    def update(self, report, *, final: bool = False, error: BaseException | None = None) -> bool:
        """Write the state if it changed or ``WRITE_EVERY_S`` passed (always when ``final``). True if written."""
        key = None
        if report is not None:
            key = (report.state, len(report.failures), *((r.state, r.status is None) for r in report.ranks))
        if not self.due(key, force=final):
            return False
        return self.write(self.snapshot(report, final=final, error=error))

    def due(self, key, *, force: bool = False) -> bool:
        """True when a state whose summary is ``key`` should be written now: it changed, ``WRITE_EVERY_S``
        passed, or ``force``; the write is then counted as done (a live session's entry asks this too)."""
        now = time.monotonic()
        since = now - self.last_write
        if not force and (since < CHANGE_GAP_S or (key == self.last_key and since < WRITE_EVERY_S)):
            return False
        self.last_key, self.last_write = key, now
        return True

    def header(self) -> dict:
        """What every snapshot of this run starts with: identity, start, the time of this write, elapsed time."""
        now = time.monotonic()
        state = {**self.base, "started": self.started, "updated": time.time(), "elapsed_s": now - self.t0}
        state["updated_monotonic"] = now  # the server adds the time since, on the same machine's clock
        return state

    def pid_start(self, pid: int | None) -> int | None:
        """``pid``'s start time (the server's identity check), read once per pid: a zombie keeps it until reaped."""
        if pid not in self.pid_starts:
            self.pid_starts[pid] = proc_start_time(pid)
        return self.pid_starts[pid]

    def write(self, state: dict) -> bool:
        """Replace the state file with ``state`` now (a live session's entry writes its own snapshot). True if
        written; a full or read-only disk costs the panel its view of this run, never the run."""
        if self.failed is not None:
            return False
        try:
            self._write(state)
        except OSError as e:
            self.failed = e
            return False
        return True

    def snapshot(self, report, *, final: bool = False, error: BaseException | None = None) -> dict:
        """The JSON-ready state of the run (``report`` may be None before the engine made one)."""
        state = self.header()
        if report is None:
            state.update(
                state=RunState.STARTING, world_size=None, backend=None, start_method=None, ranks=[], root_cause=None
            )
        else:
            failed = {f.rank: first_line(f.message) for f in report.failures if f.rank is not None}
            ranks = []
            for r in report.ranks:
                pid = r.pid or None
                ranks.append(
                    {
                        "rank": r.rank,
                        "pid": pid,
                        "pid_start": self.pid_start(pid),
                        "state": r.state,  # the recorder's
                        "exit": _exit_text(r, failed),
                        "log": os.path.basename(r.log_path) if r.log_path else None,
                        "gpu": self.gpus.get(r.rank),
                    }
                )
            state.update(
                state=run_state_of(report.state, report.ranks),
                world_size=report.world_size,
                backend=report.backend,
                start_method=report.start_method,
                ranks=ranks,
                root_cause=root_cause_line(report),
            )
            if report.ended_at is not None:
                state["elapsed_s"] = report.wall_s if report.wall_s is not None else state["elapsed_s"]
        if final:
            self._finish(state, report, error)
        return state

    def _finish(self, state: dict, report, error: BaseException | None) -> None:
        state["ended"] = time.time()
        if state["state"] in (RunState.STARTING, RunState.RUNNING):  # the engine raised before deciding an outcome
            if isinstance(error, KeyboardInterrupt):
                state["state"] = RunState.INTERRUPTED
            else:
                state["state"] = RunState.FAILED
                if error is not None and not state["root_cause"]:
                    state["root_cause"] = error_line(error)
        if report is not None:
            state["report"] = {
                "startup_s": report.startup_s,
                "wall_s": report.wall_s,
                "exit": [r.exit for r in report.ranks],
            }

    def _write(self, state: dict) -> None:
        write_in(self.run_dir, self._tmp, json.dumps(state, separators=(",", ":")).encode())
        replace_in(self.run_dir, self._tmp, STATE_FILE)  # readers see the old file or this one, never half of it
