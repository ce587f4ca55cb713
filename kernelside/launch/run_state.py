"""The run's state as the launch panel reads it: ``state.json`` in the run's own folder.

The kernel that runs a launch writes a small JSON snapshot of its ``LaunchReport`` (state,
ranks with pid and pid start time, root-cause line, report figures at the end), replaced
atomically (temporary file + rename) so a reader sees the old or the new file, whole. It is
written at every change of state and otherwise at most every ``WRITE_EVERY_S`` (the elapsed
time and a sign of life): the workers never do any of this, so a rank is never slowed.

The server extension (``jupyter_ext/runs.py``) reads these files; it repeats the names
``STATE_FILE`` and the states below, and a test checks that both sides agree.

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

STATE_FILE = "state.json"
FORMAT_VERSION = 1
WRITE_EVERY_S = 0.25
# report.outcome -> the run's state; "running" becomes "starting" until every rank runs user code
_FINAL_STATES = {
    "ok": "done",
    "failed": "failed",
    "timeout": "timeout",
    "interrupted": "interrupted",
    "stopped": "stopped",
}


def proc_start_time(pid: int | None) -> int | None:
    """A process's start time in clock ticks after boot (``/proc/<pid>/stat`` field 22), or None.

    With the pid, it names one process for good: a reused pid has another start time.

    Example::

        >>> proc_start_time(os.getpid()) > 0
        True
    """
    if not pid:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: count fields after its last ')'
    fields = stat[stat.rfind(b")") + 2 :].split()
    try:
        return int(fields[19])  # field 22 overall = index 19 after pid and comm
    except (IndexError, ValueError):
        return None


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
        "kernel_id": kernel_id,
        "kernel_pid": pid,
        "kernel_pid_start": proc_start_time(pid),
    }


def run_state_of(outcome: str, ranks: list) -> str:
    """starting | running | done | failed | timeout | interrupted | stopped, from a report's outcome."""
    if outcome in _FINAL_STATES:
        return _FINAL_STATES[outcome]
    if ranks and all(r.ready_s is not None for r in ranks):
        return "running"
    return "starting"


def _rank_state(r, failed: dict, stopping: bool) -> tuple[str, str | None]:
    if r.rank in failed:
        return "failed", failed[r.rank]
    if r.status is not None:
        if r.status.ok:
            return "done", r.status.describe()
        return ("stopped" if stopping else "failed"), r.status.describe()
    return ("running" if r.ready_s is not None else "starting"), None


def root_cause_line(report) -> str | None:
    """One line on why a run failed: 'rank 1 failed: ValueError: bad batch', or None."""
    root = report.root_cause()
    if root is None:
        return None
    first = (root.message.splitlines() or [""])[0][:300]
    return first if root.rank is None else f"rank {root.rank} failed: {first}"


class RunStateWriter:
    """Writes one run's ``state.json``: on every change at once, otherwise every ``WRITE_EVERY_S`` at most."""

    def __init__(self, run_dir: str, *, engine: str, has_control: bool = False, gpus: dict | None = None):
        self.run_dir = run_dir
        self.path = os.path.join(run_dir, STATE_FILE)
        self._tmp = os.path.join(run_dir, f".{STATE_FILE}.tmp")
        self.base = {
            "version": FORMAT_VERSION,
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
        now = time.monotonic()
        key = None
        if report is not None:
            key = (report.outcome, len(report.failures), *((r.ready_s is None, r.status is None) for r in report.ranks))
        if not final and key == self.last_key and now - self.last_write < WRITE_EVERY_S:
            return False
        self.last_key, self.last_write = key, now
        return self.write(self.snapshot(report, final=final, error=error))

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
        now = time.monotonic()
        state = {**self.base, "started": self.started, "updated": time.time(), "elapsed_s": now - self.t0}
        state["updated_monotonic"] = now  # the server adds the time since, on the same machine's clock
        if report is None:
            state.update(state="starting", world_size=None, backend=None, start_method=None, ranks=[], root_cause=None)
        else:
            failed = {f.rank: (f.message.splitlines() or [""])[0][:300] for f in report.failures if f.rank is not None}
            stopping = bool(report.failures)
            ranks = []
            for r in report.ranks:
                pid = r.pid or None
                if pid not in self.pid_starts:
                    self.pid_starts[pid] = proc_start_time(pid)  # a zombie keeps it until reaped
                rank_state, exit_text = _rank_state(r, failed, stopping)
                ranks.append(
                    {
                        "rank": r.rank,
                        "pid": pid,
                        "pid_start": self.pid_starts[pid],
                        "state": rank_state,
                        "exit": exit_text,
                        "log": os.path.basename(r.log_path) if r.log_path else None,
                        "gpu": self.gpus.get(r.rank),
                    }
                )
            state.update(
                state=run_state_of(report.outcome, report.ranks),
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
        if state["state"] in ("starting", "running"):  # the engine raised before deciding an outcome
            if isinstance(error, KeyboardInterrupt):
                state["state"] = "interrupted"
            else:
                state["state"] = "failed"
                if error is not None and not state["root_cause"]:
                    text = (str(error).splitlines() or [""])[0][:300]
                    state["root_cause"] = f"{type(error).__name__}: {text}" if text else type(error).__name__
        for rank in state["ranks"]:
            if rank["state"] in ("starting", "running"):
                rank["state"] = "stopped"
        if report is not None:
            state["report"] = {
                "startup_s": report.startup_s,
                "wall_s": report.wall_s,
                "exit": [r.exit for r in report.ranks],
            }

    def _write(self, state: dict) -> None:
        data = json.dumps(state, separators=(",", ":")).encode()
        fd = os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(self._tmp, self.path)  # readers see the old file or this one, never half of it
