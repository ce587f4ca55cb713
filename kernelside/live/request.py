"""One request to a live session's ranks, as one named value: what runs there, with which names, how shown.

A cell (a ``notebook.cell.CellProgram``), a function call or a push (``fn`` None: names set, nothing
run) is a ``LiveRequest``; ``LiveSession`` checks it against its world, packs it into the message the
ranks read (``worker.live_rank``) and runs it as one ``LiveRunEngine``.

Example::

    >>> LiveRequest(fn=None, values={}).label(3)
    'live session, push'
"""

from __future__ import annotations

import dataclasses
import functools
import pickle

from .. import interrupts
from ..errors import LaunchConfigError, LaunchError
from .names import dumps


@dataclasses.dataclass
class LiveRequest:
    """What one request carries. ``values``: name -> (pickled value, fingerprint, ref) (``NameSender``) of the
    names the ranks lack; ``assigned``: names that become the ranks' own once it ran; ``ranks`` None: all."""

    fn: object = None
    args: tuple = ()
    kwargs: dict = dataclasses.field(default_factory=dict)
    values: dict = dataclasses.field(default_factory=dict)
    assigned: tuple = ()
    return_from: tuple = ()
    ranks: tuple | None = None
    output: str | None = None  # the per-cell settings (notebook.magic_flags: the flags a live cell applies)
    progress: str | None = None
    timeout: float | None = None
    debug_of: int | None = None  # %debug: pdb in the frame where cell ``debug_of`` failed on the one rank asked

    def chosen_ranks(self, world_size: int) -> tuple[int, ...]:
        """The ranks it runs on; a rank (or ``return_from`` rank) the world lacks is an error, and nothing runs."""
        ranks = tuple(range(world_size)) if self.ranks is None else tuple(sorted(set(self.ranks)))
        bad = [r for r in (*ranks, *self.return_from) if not 0 <= r < world_size]
        if bad:
            n = world_size
            raise LaunchConfigError("--ranks", bad[0], f"a rank of this {n}-rank live session (0..{n - 1})")
        return ranks

    def message(self, req_id: int, progress: str) -> bytes:
        """The message every rank reads; what cannot be pickled is an error, and nothing runs."""
        if self.debug_of is not None:
            return pickle.dumps({"kind": "debug", "id": req_id, "of": self.debug_of}, protocol=5)
        try:
            body = {
                "kind": "run" if self.fn is not None else "push",
                "id": req_id,
                "fn": dumps(self.fn if self.fn is not None else tuple),  # a push runs nothing: the names are set
                "args": dumps((self.args, self.kwargs)) if (self.args or self.kwargs) else None,
                "names": {name: v[0] for name, v in self.values.items()},
                "return_from": tuple(self.return_from),
                "progress": self.progress or progress,
            }
            return pickle.dumps(body, protocol=5)
        except Exception as e:
            raise LaunchConfigError(
                None, None, None, message=f"cannot send this to the live ranks: {type(e).__name__}: {e}. Nothing ran."
            ) from None

    def plan_for(self, plan, ranks: tuple[int, ...]):
        """The session's plan with this request's output, progress and timeout (%debug: every line, no limit)."""
        if self.debug_of is not None:
            return dataclasses.replace(plan, output="all", timeout=None)
        output = self.output
        if output is None:
            output = plan.output if (0 in ranks or plan.output != "rank0") else "all"
        progress, timeout = self.progress or plan.progress, self.timeout or plan.timeout
        if (output, progress, timeout) == (plan.output, plan.progress, plan.timeout):
            return plan  # (most cells: the session's own; a plan is frozen)
        return dataclasses.replace(plan, output=output, progress=progress, timeout=timeout)

    def render(self, default: str) -> str:
        """How its output is shown: a pdb conversation with one rank is its lines in the cell, nothing drawn."""
        return "text" if self.debug_of is not None else default

    def label(self, req_id: int) -> str:
        if self.debug_of is not None:
            return f"live session, %debug of cell {self.debug_of}"
        return f"live session, cell {req_id}" if self.fn is not None else "live session, push"


def one_request_at_a_time(method):
    """Run a request holding the session's lock; a second thread gets a clear error instead of a wait.
    (The panel's Stop between cells holds it for a moment: then the request waits, and finds the session gone.)"""

    @functools.wraps(method)
    @interrupts.deferring(interrupts.REQUEST_NOT_SENT)
    def wrapper(self, *args, **kwargs):
        if not self.life.acquire(blocking=False):
            if not self.runs.stop_asked.is_set():
                raise LaunchError("nblaunch: the live session is already running a cell (from another thread).")
            self.life.acquire()
        try:
            return method(self, *args, **kwargs)
        finally:
            self.life.release()

    return wrapper
