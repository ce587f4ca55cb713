"""The run report and the failure summary: plain data, testable without a kernel.

Example::

    >>> rep = last_report()            # after any launch        # doctest: +SKIP
    >>> rep.outcome, rep.startup_s, [r.status.describe() for r in rep.ranks]
"""

from __future__ import annotations

import dataclasses
import enum
import re

from ..engines.contract import ExitStatus
from ..run_contract import RankState, RunState
from ..short_traceback import first_line

# Errors a rank raises *because a peer died* (its collective lost the connection). They are
# never the root cause while a rank with another failure exists.
_PEER_LOSS = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|NCCL communicator was aborted|"
    r"DistNetworkError|recvBytes|sendBytes|socket closed|Socket Timeout|ECONNRESET|EPIPE",
    re.IGNORECASE,
)


class FailureKind(str, enum.Enum):
    """What a ``Failure`` is (the root cause is chosen among them: ``LaunchReport.root_cause``)."""

    ERROR = "error"  # an exception in the rank
    EXIT = "exit"  # the rank died or exited badly (or the engine failed without a rank's error)
    TIMEOUT = "timeout"  # the run's deadline passed
    STOPPED = "stopped"  # Stop in the Runs view or the launch panel
    LEFT = "left"  # a rank's own sys.exit while its peers waited (RunRecorder._blame_departures)


@dataclasses.dataclass
class Failure:
    rank: int | None  # None: the launch as a whole (timeout)
    kind: FailureKind
    message: str
    t: float  # when it happened (error events) or was seen (exits), on the run recorder's clock
    traceback: str | None = None
    phase: str | None = None
    exc_type: str | None = None
    status: ExitStatus | None = None

    @classmethod
    def from_error(cls, rank: int, payload: dict, clock: str = "monotonic") -> Failure:
        """A failure from a worker's ``error`` event (``lifecycle.error_payload``), timed on ``clock``."""
        return cls(
            rank=rank,
            kind=FailureKind.ERROR,
            message=f"{payload['type']}: {payload['message']}",
            t=payload["wall" if clock == "wall" else "t"],
            traceback=payload["traceback"],
            phase=payload["phase"],
            exc_type=payload["type"],
        )

    @property
    def caused_by_peer(self) -> bool:
        return self.kind is FailureKind.ERROR and bool(_PEER_LOSS.search(f"{self.exc_type} {self.message}"))


@dataclasses.dataclass
class RankReport:
    rank: int
    pid: int
    log_path: str
    ready_s: float | None = None  # seconds from the call until this rank ran user code
    done_s: float | None = None  # ... until the launched code returned on this rank
    ended_s: float | None = None
    status: ExitStatus | None = None
    # Sampled through nvidia-ml-py (launch/gpu_usage.py) while the rank ran; None without NVML or GPU.
    gpu_index: int | None = None  # the kernel's CUDA index of the GPU where the rank held most memory
    gpu_memory_bytes: int | None = None  # the most device memory the rank and its children held in a sample
    gpu_util_percent: float | None = None  # mean utilization over the samples (the process's, else its GPU's)
    left: dict | None = None  # it left on its own (sys.exit(0) in the launched code): worker/rank_departure.py
    state: RankState = RankState.STARTING  # moved by the run recorder alone (launch/recorder.py)

    @property
    def exit(self) -> str:
        if self.left is not None:  # its own exit, not the SIGTERM it may have got while tearing down
            return describe_departure(self.left)
        return self.status.describe() if self.status else RankState.RUNNING.value  # (no exit yet)


@dataclasses.dataclass
class LaunchReport:
    world_size: int
    backend: str
    start_method: str
    port: int
    log_dir: str
    started_at: float
    ranks: list[RankReport] = dataclasses.field(default_factory=list)
    failures: list[Failure] = dataclasses.field(default_factory=list)
    state: RunState = RunState.RUNNING  # the recorder's alone: RUNNING until it decides the outcome
    startup_s: float | None = None  # call → every rank running user code
    wall_s: float | None = None
    ended_at: float | None = None
    metrics: list[dict] = dataclasses.field(default_factory=list)  # every log_metrics() point, in order
    event_counts: dict = dataclasses.field(default_factory=dict)  # worker events received, by kind
    engine: str = "local"
    return_all: bool = False  # every rank sends its value (else rank 0 only)
    clock: str = "monotonic"  # the clock of Failure.t: "monotonic" on one machine, "wall" across machines
    session: str = ""  # a live session's run: "live session, cell 3" (shown in the status line)
    notes: list[str] = dataclasses.field(default_factory=list)  # what the engine did after a failure

    @property
    def outcome(self) -> str:
        """The outcome in one word, as the notebook shows it: running | ok | failed | timeout | interrupted | stopped
        (``state``, the run's ``RunState``, said as a user reads it)."""
        return "ok" if self.state is RunState.DONE else self.state.value

    def metrics_frame(self):
        """The metrics history as a pandas DataFrame (pandas must be installed)."""
        import pandas as pd

        return pd.DataFrame(self.metrics)

    def root_cause(self) -> Failure | None:
        """The first failure that was not merely a consequence of another rank's death."""
        if not self.failures:
            return None
        primary = [f for f in self.failures if not f.caused_by_peer and f.kind is not FailureKind.TIMEOUT]
        timeouts = [f for f in self.failures if f.kind is FailureKind.TIMEOUT]
        if timeouts and (not primary or timeouts[0].t <= min(f.t for f in primary)):
            return timeouts[0]
        pool = primary or self.failures
        return min(pool, key=lambda f: f.t)

    def _repr_markdown_(self) -> str:
        gpu = any(r.gpu_index is not None for r in self.ranks)  # GPU columns only when NVML gave figures
        rows = ["| rank | pid | ready (s) | ended (s) | exit | log |", "|---|---|---|---|---|---|"]
        if gpu:
            rows = [rows[0] + " GPU | GPU memory (MiB) | GPU util (%) |", rows[1] + "---|---|---|"]
        for r in self.ranks:
            ready = f"{r.ready_s:.2f}" if r.ready_s is not None else "-"
            ended = f"{r.ended_s:.2f}" if r.ended_s is not None else "-"
            row = f"| {r.rank} | {r.pid} | {ready} | {ended} | {r.exit} | `{r.log_path}` |"
            if gpu:
                row += " " + " | ".join(_or_dash(v) for v in _gpu_cells(r)) + " |"
            rows.append(row)
        live = f" ({self.session})" if self.session else ""
        head = (
            f"**nblaunch run: {self.outcome}**{live} — {self.world_size} ranks, {self.backend}, {self.start_method}, "
            f"start-up {self.startup_s or 0:.2f}s, wall {self.wall_s or 0:.2f}s, logs in `{self.log_dir}`"
        )
        return head + "\n\n" + "\n".join(rows)

    def _repr_html_(self) -> str:
        """The same table, with each rank's log linked: nblaunch's JupyterLab extension opens it in a log tab
        (the path stays in the link's hover text and in the markdown form)."""
        from ..display.report_view import report_html

        return report_html(self)

    def __repr__(self) -> str:
        lines = [
            f"LaunchReport(outcome={self.outcome!r}, world_size={self.world_size}, backend={self.backend!r}, "
            f"start_method={self.start_method!r}, startup_s={self.startup_s}, wall_s={self.wall_s}, "
            f"log_dir={self.log_dir!r})"
        ]
        lines += [f"  rank {r.rank}: pid {r.pid}, {r.exit}, log {r.log_path}" for r in self.ranks]
        return "\n".join(lines)


def _gpu_cells(r: RankReport) -> tuple:
    mib = None if r.gpu_memory_bytes is None else f"{r.gpu_memory_bytes / 2**20:.0f}"
    return (r.gpu_index, mib, r.gpu_util_percent)


def _or_dash(value) -> str:
    return "-" if value is None else str(value)


def format_failure_message(report: LaunchReport, root: Failure, router) -> str:
    """What the user reads: which rank, why, its traceback, its last output, the others, the logs."""
    parts, quoted = [], [root]
    if root.kind is FailureKind.LEFT:  # a rank's own sys.exit(0) while its peers waited for it
        parts, quoted = _departure_parts(report, root)
    elif root.kind is FailureKind.TIMEOUT:
        # a live session's ranks go back to idle (the notes say if the session restarted); one-shot ranks end
        after = (
            "every rank stopped the cell" if report.session else "every rank was stopped and nothing is left running"
        )
        parts.append(f"nblaunch: {root.message}: {after} ({report.world_size} ranks).")
    elif root.kind is FailureKind.STOPPED:
        parts.append(f"nblaunch: {root.message} ({report.world_size} ranks).")
    elif root.rank is None:  # the engine itself failed (Ray Train), with no rank to blame
        return f"nblaunch: {root.message}\nlogs of every rank: {report.log_dir}"
    elif root.exc_type == "BdbQuit":  # q in rank 0's pdb (worker/rank_stdin.py): the user's choice, not a crash
        parts.append(f"nblaunch: the debugger on rank {root.rank} was quit (q); the launch was stopped on every rank.")
    else:
        where = f" during {root.phase}" if root.phase and root.phase != "run" else ""
        parts.append(f"nblaunch: rank {root.rank} failed{where}: {root.message}")
        if root.traceback:
            parts.append(f"\n--- rank {root.rank} traceback ---\n{root.traceback.rstrip()}")
    if root.rank is not None:
        tail = router.tail(root.rank)
        if tail:
            parts.append(f"\n--- last output of rank {root.rank} ---\n{tail.rstrip()}")
    others = [f for f in report.failures if not any(f is q for q in quoted)]
    if others:
        parts.append(
            "\nalso failed: "
            + "; ".join(f"rank {f.rank}: {f.message.splitlines()[0][:200]}" for f in others if f.rank is not None)
        )
    failed = {f.rank for f in report.failures}
    finished = [r.rank for r in report.ranks if r.rank not in failed and r.state is RankState.DONE]
    stopped = [r.rank for r in report.ranks if r.rank not in failed and r.rank not in finished]
    if root.caused_by_peer:
        gone = (
            f"rank(s) {', '.join(map(str, finished))} had already finished normally"
            if finished
            else "another rank went away"
        )
        parts.append(
            f"\nThis error means a peer left the collective: {gone}. Did one rank skip a collective, "
            "return early, or take a different code path?"
        )
    if finished:
        parts.append(f"finished normally: rank(s) {', '.join(map(str, finished))}")
    if stopped:
        parts.append(f"stopped by nblaunch: rank(s) {', '.join(map(str, stopped))}")
    parts.append(f"logs of every rank: {report.log_dir}")
    return "\n".join(parts)


def describe_departure(left: dict) -> str:
    """'exit code 0 (left on its own: sys.exit(0) at <cell>, line 4)' from a rank's ``left`` event."""
    return f"exit code {left['code']} (left on its own: {left['where']})"


def _departure_parts(report: LaunchReport, root: Failure) -> tuple[list[str], list[Failure]]:
    """What the failure message says when a departure is the root cause, and the failures it quoted."""
    losses = [f for f in report.failures if f.caused_by_peer]
    parts, quoted = [f"nblaunch: rank {root.rank} {root.message}."], [root]
    if losses:
        first = min(losses, key=lambda f: f.t)
        quoted.append(first)
        parts.append(f"rank {first.rank} was still waiting for it and then failed: {first_line(first.message)}")
        if first.traceback:
            head = f"\n--- rank {first.rank} traceback (the collective it was in) ---\n"
            parts.append(head + first.traceback.rstrip())
    parts.append(
        "\nEvery rank must reach the same collectives: leave with sys.exit() on all ranks at the same point, "
        "or let the launched code return on every rank."
    )
    return parts, quoted
