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


_current: list[WorkerContext | None] = [None]


def current() -> WorkerContext | None:
    return _current[0]


def set_current(ctx: WorkerContext | None) -> None:
    _current[0] = ctx
