"""A rank that leaves on its own (``sys.exit(0)`` in the launched code) while its peers still wait
for it in a collective: the peers' "connection closed" errors are its consequence, not the cause.

In the rank, ``announce()`` sends a ``left`` event (exit code, where ``sys.exit`` was called) before
the process ends. In the kernel, ``record()`` keeps it on the rank's report, and
``blame_departures()`` — run once every pipe is drained — makes it the root cause when the launch
then failed with peer-loss errors raised after it left. The rank's report then shows its own exit
(``exit code 0``), not the SIGTERM nblaunch sent while it was tearing down.

Example::

    >>> describe({"code": 0, "where": "sys.exit(0) at <%%distributed cell In[4]>, line 4"})
    'exit code 0 (left on its own: sys.exit(0) at <%%distributed cell In[4]>, line 4)'
"""

from __future__ import annotations

import os
import time
import traceback
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the worker imports this module; the report module imports the worker's
    from .report import Failure, LaunchReport

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def announce(events, exc: SystemExit) -> None:
    """(rank) Tell the kernel this rank is leaving on its own, and from where."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if os.path.dirname(f.filename) != _PACKAGE_DIR]
    code = exc.code if isinstance(exc.code, int) else 0
    where = f"sys.exit({exc.code if exc.code is not None else ''})"
    if frames:
        where += f" at {frames[-1].filename}, line {frames[-1].lineno}"
    try:
        events.send("left", {"code": code, "where": where, "t": time.monotonic()})
    except Exception:
        pass  # the kernel still sees the exit status


def record(report: LaunchReport, rank: int, payload: dict) -> None:
    """(kernel) Keep a ``left`` event on the rank's report."""
    if rank < len(report.ranks):
        report.ranks[rank].left = payload


def describe(left: dict) -> str:
    return f"exit code {left['code']} (left on its own: {left['where']})"


def blame_departures(report: LaunchReport) -> None:
    """(kernel) Make ranks that left before the peer-loss errors they caused the root cause. Idempotent."""
    from .report import Failure

    peer_losses = [f for f in report.failures if f.caused_by_peer]
    if not peer_losses or any(not f.caused_by_peer and f.kind != "left" for f in report.failures):
        return  # nothing to explain, or a real failure explains it
    first_loss = min(peer_losses, key=lambda f: f.t)
    failed = {f.rank for f in report.failures}
    for rr in report.ranks:
        left = rr.left
        if left is None or rr.rank in failed or left["t"] > first_loss.t:
            continue
        report.failures.append(
            Failure(
                rank=rr.rank,
                kind="left",
                message=f"left on its own ({left['where']}; exit code {left['code']}) before rank "
                f"{first_loss.rank}'s collective finished",
                t=left["t"],
                phase="run",
            )
        )


def message_parts(report: LaunchReport, root: Failure) -> tuple[list[str], list[Failure]]:
    """(kernel) What the failure message says when a departure is the root cause, and the failures it quoted."""
    losses = [f for f in report.failures if f.caused_by_peer]
    parts, quoted = [f"nblaunch: rank {root.rank} {root.message}."], [root]
    if losses:
        first = min(losses, key=lambda f: f.t)
        quoted.append(first)
        parts.append(
            f"rank {first.rank} was still waiting for it and then failed: {first.message.splitlines()[0][:300]}"
        )
        if first.traceback:
            head = f"\n--- rank {first.rank} traceback (the collective it was in) ---\n"
            parts.append(head + first.traceback.rstrip())
    parts.append(
        "\nEvery rank must reach the same collectives: leave with sys.exit() on all ranks at the same point, "
        "or let the launched code return on every rank."
    )
    return parts, quoted
