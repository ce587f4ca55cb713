"""The run report and the failure summary: plain data, testable without a kernel.

Example::

    >>> rep = last_report()            # after any launch        # doctest: +SKIP
    >>> rep.outcome, rep.startup_s, [r.status.describe() for r in rep.ranks]
"""

from __future__ import annotations

import dataclasses
import re

from .group import ExitStatus

# Errors a rank raises *because a peer died* (its collective lost the connection). They are
# never the root cause while a rank with another failure exists.
_PEER_LOSS = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|NCCL communicator was aborted|"
    r"DistNetworkError|recvBytes|sendBytes|socket closed|Socket Timeout|ECONNRESET|EPIPE",
    re.IGNORECASE,
)


@dataclasses.dataclass
class Failure:
    rank: int | None  # None: the launch as a whole (timeout)
    kind: str  # "error" (an exception in the rank) | "exit" (died or exited badly) | "timeout" | "stopped" (panel)
    message: str
    t: float  # monotonic time the failure happened (error events) or was seen (exits)
    traceback: str | None = None
    phase: str | None = None
    exc_type: str | None = None
    status: ExitStatus | None = None

    @classmethod
    def from_error(cls, rank: int, payload: dict) -> Failure:
        """A failure from a worker's ``error`` event (see ``worker._error_payload``)."""
        return cls(
            rank=rank,
            kind="error",
            message=f"{payload['type']}: {payload['message']}",
            t=payload["t"],
            traceback=payload["traceback"],
            phase=payload["phase"],
            exc_type=payload["type"],
        )

    @property
    def caused_by_peer(self) -> bool:
        return self.kind == "error" and bool(_PEER_LOSS.search(f"{self.exc_type} {self.message}"))


@dataclasses.dataclass
class RankReport:
    rank: int
    pid: int
    log_path: str
    ready_s: float | None = None  # seconds from the call until this rank ran user code
    done_s: float | None = None  # ... until the launched code returned on this rank
    ended_s: float | None = None
    status: ExitStatus | None = None

    @property
    def exit(self) -> str:
        return self.status.describe() if self.status else "running"


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
    outcome: str = "running"  # running | ok | failed | timeout | interrupted | stopped
    startup_s: float | None = None  # call → every rank running user code
    wall_s: float | None = None
    ended_at: float | None = None
    metrics: list[dict] = dataclasses.field(default_factory=list)  # every log_metrics() point, in order
    event_counts: dict = dataclasses.field(default_factory=dict)  # worker events received, by kind

    def metrics_frame(self):
        """The metrics history as a pandas DataFrame (pandas must be installed)."""
        import pandas as pd

        return pd.DataFrame(self.metrics)

    def root_cause(self) -> Failure | None:
        """The first failure that was not merely a consequence of another rank's death."""
        if not self.failures:
            return None
        primary = [f for f in self.failures if not f.caused_by_peer and f.kind != "timeout"]
        timeouts = [f for f in self.failures if f.kind == "timeout"]
        if timeouts and (not primary or timeouts[0].t <= min(f.t for f in primary)):
            return timeouts[0]
        pool = primary or self.failures
        return min(pool, key=lambda f: f.t)

    def _repr_markdown_(self) -> str:
        rows = ["| rank | pid | ready (s) | ended (s) | exit | log |", "|---|---|---|---|---|---|"]
        for r in self.ranks:
            ready = f"{r.ready_s:.2f}" if r.ready_s is not None else "-"
            ended = f"{r.ended_s:.2f}" if r.ended_s is not None else "-"
            rows.append(f"| {r.rank} | {r.pid} | {ready} | {ended} | {r.exit} | `{r.log_path}` |")
        head = (
            f"**nblaunch run: {self.outcome}** — {self.world_size} ranks, {self.backend}, {self.start_method}, "
            f"start-up {self.startup_s or 0:.2f}s, wall {self.wall_s or 0:.2f}s, logs in `{self.log_dir}`"
        )
        return head + "\n\n" + "\n".join(rows)

    def __repr__(self) -> str:
        lines = [
            f"LaunchReport(outcome={self.outcome!r}, world_size={self.world_size}, backend={self.backend!r}, "
            f"start_method={self.start_method!r}, startup_s={self.startup_s}, wall_s={self.wall_s}, "
            f"log_dir={self.log_dir!r})"
        ]
        lines += [f"  rank {r.rank}: pid {r.pid}, {r.exit}, log {r.log_path}" for r in self.ranks]
        return "\n".join(lines)


def format_failure_message(report: LaunchReport, root: Failure, router) -> str:
    """What the user reads: which rank, why, its traceback, its last output, the others, the logs."""
    parts = []
    if root.kind in ("timeout", "stopped"):
        parts.append(f"nblaunch: {root.message} ({report.world_size} ranks).")
    else:
        where = f" during {root.phase}" if root.phase and root.phase != "run" else ""
        parts.append(f"nblaunch: rank {root.rank} failed{where}: {root.message}")
        if root.traceback:
            parts.append(f"\n--- rank {root.rank} traceback ---\n{root.traceback.rstrip()}")
    if root.rank is not None:
        tail = router.tail(root.rank)
        if tail:
            parts.append(f"\n--- last output of rank {root.rank} ---\n{tail.rstrip()}")
    others = [f for f in report.failures if f is not root]
    if others:
        parts.append(
            "\nalso failed: "
            + "; ".join(f"rank {f.rank}: {f.message.splitlines()[0][:200]}" for f in others if f.rank is not None)
        )
    failed = {f.rank for f in report.failures}
    finished = [r.rank for r in report.ranks if r.rank not in failed and r.done_s is not None]
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
