"""Any rank's debugger, driven from the cell: ``breakpoint()``, ``pdb.set_trace()`` and
``torch.distributed.breakpoint(rank=N)`` on every rank.

pdb reads its commands through ``input()``, which ``rank_stdin`` sends to the notebook: here every
rank's pdb gets a prompt that says which rank it is (``(rank 1) (Pdb)``). Rank 0's output already
reaches the cell; another rank's goes to its log file, so its debugger writes into ``DebuggerText``
instead, which travels to the cell with the next prompt. The kernel asks one prompt at a time
(``display/stdin_relay.py``): two ranks stopping at once are served in turn, each labelled.

``torch.distributed.breakpoint(rank=N)`` is replaced by one that works in a launched rank (torch's
reads ``/dev/stdin``, which a rank has not, and raises ``BdbQuit`` at once): every rank raises its
groups' timeouts for the session (peers wait in a barrier for the rank being debugged; half an
hour of debugging must not time them out), rank N opens the debugger in the caller's frame, and
once it continues every rank meets in the barrier and puts the timeouts back as they were.

Example (in a ``%%distributed`` cell)::

    torch.distributed.breakpoint(rank=1)      # "(rank 1) (Pdb)" under the cell; c continues every rank
"""

from __future__ import annotations

import datetime
import io
import sys

from . import live_rescue


class DebuggerText(io.TextIOBase):
    """What a debugger on a rank other than 0 prints: held until its next prompt carries it to the cell."""

    def __init__(self):
        super().__init__()
        self._parts: list[str] = []

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self._parts.append(text)
        return len(text)

    def take(self) -> str:
        """Everything written since the last call (the prompt that goes now carries it)."""
        text, self._parts = "".join(self._parts), []
        return text


def install(rank: int, text: DebuggerText | None) -> None:
    """Make pdb in this rank the standard library's, prompting ``(rank N) (Pdb)``, writing to ``text``
    (None: the rank's stdout, which for rank 0 is the cell)."""
    import pdb

    # ipykernel makes pdb.Pdb IPython's debugger, which starts a terminal IPython shell where none
    # runs (a rank would look interactive again): a rank gets the standard pdb
    stdlib = next(c for c in pdb.Pdb.__mro__ if c.__module__ == "pdb" and c.__name__ == "Pdb")

    class RankPdb(stdlib):
        def __init__(self, completekey="tab", stdin=None, stdout=None, *args, **kwargs):
            super().__init__(completekey, stdin, stdout if stdout is not None else text, *args, **kwargs)
            self.prompt = f"(rank {rank}) (Pdb) "
            self.use_rawinput = stdin is None  # (pdb turns it off when given a stdout): commands come by input()

    RankPdb.__qualname__ = RankPdb.__name__ = "Pdb"
    pdb.Pdb = RankPdb
    pdb.set_trace = _set_trace
    debugger = sys.modules.get("IPython.core.debugger")
    if debugger is not None:  # `from IPython.core.debugger import set_trace` users
        debugger.set_trace = _set_trace


def _set_trace(frame=None, *, header=None):
    """The standard library's ``pdb.set_trace()``, with this rank's debugger."""
    import pdb

    debugger = pdb.Pdb()
    if header is not None:
        debugger.message(header)
    debugger.set_trace(frame or sys._getframe().f_back)


def install_distributed_breakpoint() -> None:
    """Replace ``torch.distributed.breakpoint`` in this rank (torch must be imported)."""
    import torch.distributed as dist

    if getattr(dist.breakpoint, "_nblaunch", False):
        return
    seen: dict[str, int] = {}

    def breakpoint(rank: int = 0, skip: int = 0, timeout_s=3600):
        """Stop rank ``rank`` in the debugger (in the cell); every other rank waits for it without timing out."""
        import bdb
        import pdb
        import traceback

        caller = sys._getframe().f_back
        if skip > 0:
            key = "".join(traceback.format_stack(caller))
            seen[key] = seen.get(key, 0) + 1
            if seen[key] <= skip:
                return
        kept = _raise_timeouts(timeout_s)
        try:
            if dist.get_rank() == rank:
                debugger = pdb.Pdb()
                debugger.message(f"torch.distributed.breakpoint(rank={rank}): every other rank waits; c continues all")
                debugger.reset()
                debugger.interaction(caller, None)  # look around in the caller's frame; c / n / s leave
                if debugger.quitting:  # q: the launch stops, as q in any rank's debugger does
                    raise bdb.BdbQuit
            dist.barrier()
        finally:
            for group, timeout in kept.items():
                dist.distributed_c10d._set_pg_timeout(timeout, group)

    breakpoint._nblaunch = True
    breakpoint.__wrapped__ = dist.breakpoint
    dist.breakpoint = breakpoint


def _raise_timeouts(timeout_s) -> dict:
    """Every group's timeout raised to ``timeout_s`` (never lowered); returns what to put back."""
    import torch.distributed.distributed_c10d as c10d

    kept = {}
    if timeout_s is None:
        return kept
    wanted = datetime.timedelta(seconds=timeout_s)
    for group in list(c10d._world.pg_map):
        current = live_rescue.group_timeout(group)
        if current is not None and current < wanted:
            c10d._set_pg_timeout(wanted, group)
            kept[group] = current
    return kept
