"""What a rank knows about itself while user code runs: ``rank``, ``device``, where events go, how to show bars.

Every engine's worker sets this once (``set_current``) before user code runs; ``progress()``,
``log_metrics()`` and cell code read it. In the kernel it is None.

Example::

    >>> from kernelside.worker.context import current
    >>> current() is None        # in the kernel
    True
"""

from __future__ import annotations

import dataclasses
import time

RENDERS = ("widgets", "text", "off")  # widgets: send events for the kernel to draw; text: tqdm on stderr


@dataclasses.dataclass
class WorkerContext:
    """What user code can ask about the worker it runs in (``kernelside.worker_context()``)."""

    rank: int
    local_rank: int
    world_size: int
    device: str
    events: object  # has send(kind, payload) and send_result(body): the channel to the kernel
    progress_render: str = "text"
    progress_scope: str = "rank0"  # "rank0" | "all": whose bars and metrics are shown

    def shows_bars(self) -> bool:
        return self.rank == 0 or self.progress_scope == "all"


def stamp() -> dict:
    """The time of an event on both clocks: monotonic for one machine, wall time across machines."""
    return {"t": time.monotonic(), "wall": time.time()}


class _ThisRank:
    context: WorkerContext | None = None


# Global on purpose: a rank process runs one launch, and user code calls progress(), log_metrics() or
# display() with no handle to pass; in the kernel it stays None (launch() refuses to run inside a rank by it).
THIS_RANK = _ThisRank()


def current() -> WorkerContext | None:
    """This rank's context, or None outside a rank (in the kernel)."""
    return THIS_RANK.context


def set_current(ctx: WorkerContext | None) -> None:
    THIS_RANK.context = ctx
