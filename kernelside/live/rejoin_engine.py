"""The start of lost ranks' replacements in a live world that replaces them (``live.ray_world``): one run of the
kernel loop in which the new ranks come up while the ranks that stayed rebuild the default process group, in
their own processes and with their state, to the generation the new ranks join (``worker.live_rescue``).

Example::

    >>> engine = RejoinEngine(session, kept=(0, 1, 3), gen=4)       # doctest: +SKIP
"""

from __future__ import annotations

import pickle

from .request_engine import LiveRunEngine


class RejoinEngine(LiveRunEngine):
    """A start run (request 0) over every rank: the new ones start, the ``kept`` ones rebuild to group ``gen``."""

    def __init__(self, session, *, kept: tuple[int, ...], gen: int):
        super().__init__(session, 0, range(session.plan.num_processes), blob=None, timeout=None, label="live session")
        self.defer_display = False
        self.kept, self.gen = kept, gen

    def start(self, recorder) -> None:
        super().start(recorder)
        workers = self.session.world.group.workers
        # their old group lost a peer: its connections shut first, as after an abort; then every kept rank makes the
        # new group (its idle, for request 0, says so), which the new ranks' start joins
        self._control("abort", [w for w in workers if w.rank in self.kept])
        self.session.world.send(self.kept, pickle.dumps({"kind": "rebuild", "id": 0, "gen": self.gen}, protocol=5))

    def close(self, grace: float, recorder) -> None:
        super().close(grace, recorder)
        if recorder.report.failures:
            return
        off = [r for r in self.ranks if self.idle.get(r, {}).get("group") != self.gen]
        if off:
            recorder.engine_failed(f"rank(s) {', '.join(map(str, off))} did not join the rebuilt process group")
