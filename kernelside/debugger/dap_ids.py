"""One id space for the debugger panel over the kernel and every rank.

Each rank's debugger (pydevd) numbers its threads, frames and variable references from its own counters, so
rank 0's thread 1 and rank 1's thread 1 are different threads, and both differ from the kernel's. The panel
sees ids made here instead: unique across ranks, far above any the kernel's own debugger hands out (pydevd's
references are object addresses, below 2**48), and within a JavaScript number's exact range (2**53).
``inward`` says whose an id is, so a request that names one goes to that rank alone.

Example::

    >>> ids = DapIds()
    >>> t = ids.outward(1, "thread", 1)
    >>> ids.inward(t), ids.inward(7)
    ((1, 'thread', 1), None)
"""

from __future__ import annotations

import threading

BASE = 1 << 50


class DapIds:
    def __init__(self):
        self.lock = threading.Lock()
        self.next = BASE
        self.out: dict[tuple, int] = {}
        self.back: dict[int, tuple] = {}

    def outward(self, rank: int, kind: str, local: int) -> int:
        """The panel's id for ``rank``'s ``kind`` ("thread", "frame", "ref") number ``local``."""
        key = (rank, kind, local)
        with self.lock:
            known = self.out.get(key)
            if known is None:
                known = self.out[key] = self.next
                self.back[known] = key
                self.next += 1
            return known

    def inward(self, panel_id) -> tuple[int, str, int] | None:
        """(rank, kind, local) for a panel id made here; None for the kernel's own ids."""
        if not isinstance(panel_id, int) or panel_id < BASE:
            return None
        with self.lock:
            return self.back.get(panel_id)

    def forget(self, rank: int, kinds=("frame", "ref")) -> None:
        """A rank ran on: its frames and references are stale (DAP: valid only while stopped)."""
        with self.lock:
            for key in [k for k in self.out if k[0] == rank and k[1] in kinds]:
                del self.back[self.out.pop(key)]

    def threads_of(self, rank: int) -> list[int]:
        with self.lock:
            return [g for (r, kind, _), g in self.out.items() if r == rank and kind == "thread"]
