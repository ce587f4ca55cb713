"""Step 2 of ``sharded_results``: how the ranks agree on what their return values hold sharded before they
gather it, and the kernel's part in that.

Ranks whose value holds sharded objects (DTensors, FSDP1 models) gather them together, so each must first
learn that every peer holds the same ones: otherwise it would wait for ever in a collective its peers never
join. Each rank's answer is a record in the run's c10d store, under ``key(run, rank)``: what it holds sharded,
at which paths, whether it keeps the result, and whether it left (``sys.exit``) instead.

``run`` names the run on every rank alike: ``RUN`` for a launch, the request's id for a live cell. (A
per-process count would not do: a live rank that failed one cell would be a call behind its peers at the next.)

**Relayed** (``RankSpec.gather_relay``: the kernel holds the store, as for a launch on this machine and for a
live world here or on Ray): a rank that holds nothing sharded writes nothing. Its ``done`` event says so
(``done_fields``), and the kernel writes that rank's record only once some rank of the run says it gathers
(``GatherRelay``), then deletes the run's records as the run ends. Nearly every run and cell holds nothing
sharded: it then costs the store nothing and leaves nothing in it (one record a rank a cell, for the
session's life, before). **Otherwise** (Ray Train, torch's elastic launcher: the store is theirs) every rank
writes its own record. Either way, only a rank that gathers waits for the records.

Example (what a rank that gathers writes, and reads back for every rank)::

    >>> key(RUN, 1)
    'nblaunch/result-gather/run/1'
    >>> pickle.loads(record([("dtensor", ((4, 2), "torch.float32"))], ["the cell's result"], keep=True))[2]
    True
"""

from __future__ import annotations

import pickle

PREFIX = "nblaunch/result-gather/"
RUN = "run"  # the ``run`` of a launch: each rank process gathers once


def key(run: str, rank: int) -> str:
    return f"{PREFIX}{run}/{rank}"


def record(sharded: list, paths: list, keep: bool, left: bool = False) -> bytes:
    """One rank's record: (what it gathers as (kind, meta) pairs, their paths, it keeps the result, it left)."""
    return pickle.dumps((sharded, paths, keep, left))


def done_fields(gathers: bool, keep: bool) -> dict:
    """What a relayed rank's ``done`` event adds: whether it gathers, and whether it keeps the result."""
    return {"gathers": gathers, "keep": keep}


class GatherRelay:
    """The kernel's half of a relayed agreement (one per run): it writes the record of each rank that said, in its
    ``done``, that it holds nothing sharded, once some rank of the run says it gathers; ``forget()`` deletes the
    run's records. ``store()``: the kernel's store now (None once the run's engine dropped it)."""

    def __init__(self, store, run: str, world_size: int):
        self.store, self.run, self.world_size = store, run, world_size
        self.quiet: dict[int, bool] = {}  # rank -> it keeps the result, for ranks holding nothing sharded
        self.written: set[int] = set()
        self.gathering = False  # some rank of the run gathers

    def on_done(self, rank: int, kind: str, payload) -> None:
        if not isinstance(payload, dict) or "gathers" not in payload:
            return  # a rank that writes its own record (not relayed)
        if payload["gathers"]:
            self.gathering = True
        else:
            self.quiet[rank] = bool(payload.get("keep"))
        if not self.gathering:
            return
        store = self.store()
        for r, keep in self.quiet.items():
            if r not in self.written and store is not None:
                store.set(key(self.run, r), record([], [], keep))
                self.written.add(r)

    def forget(self) -> None:
        """Delete the run's records (every rank is past the agreement): a live world's store outlives its cells."""
        store = self.store() if self.gathering else None
        for r in range(self.world_size) if store is not None else ():
            try:
                store.delete_key(key(self.run, r))
            except Exception:  # noqa: BLE001 - a record never written, or the store gone: nothing is kept then
                pass
        self.gathering = False
