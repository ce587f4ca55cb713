"""``%debug`` after an nblaunch failure: never a post-mortem in nblaunch's own frames.

IPython's ``%debug`` opens the last traceback; after a failed launch that is the kernel's side of
it (``launch/recorder.py`` raising the ``WorkerError``), not the rank's frame, which lived in another
process. ``install()`` puts a ``%debug`` in front of IPython's:

- the last error is nblaunch's and carries a ``post_mortem()`` (a live session's failure, whose
  rank is still there): that runs, in the cell;
- it is nblaunch's without one: one line; after a one-shot launch (the rank has exited) it says how to
  get to the rank's frame (a live session);
- anything else, and every use with arguments or a cell: IPython's own ``%debug``.

Example::

    >>> install(get_ipython())        # doctest: +SKIP  (%load_ext kernelside does this)
"""

from __future__ import annotations

import sys

from ..errors import WorkerError
from ..live import registry as live_session


def one_shot_hint(error: BaseException) -> str:
    """The one line ``%debug`` prints after a one-shot launch failed."""
    who = f"rank {error.rank}" if isinstance(error, WorkerError) and error.rank is not None else "the ranks"
    return (
        f"nblaunch: %debug cannot open {who}'s frame: it ran in a launch whose ranks have exited. "
        "Run the cell in a live session (%distributed_start, then the cell again) and %debug opens the failed "
        "rank's frame there; its traceback is above."
    )


def live_hint(error: WorkerError) -> str:
    """The one line ``%debug`` prints after a live cell failed, when the session offers no post-mortem."""
    who = f"rank {error.rank}" if error.rank is not None else "the ranks"
    return f"nblaunch: %debug cannot open {who}'s frame in this live session; its traceback is above."


def _from_live_session(error: WorkerError) -> bool:
    session = live_session.current()
    log_dir = getattr(error.report, "log_dir", None)
    return session is not None and log_dir is not None and log_dir == getattr(session, "log_dir", None)


def install(shell) -> None:
    """Put nblaunch's ``%debug`` in front of IPython's (idempotent)."""
    if getattr(shell.magics_manager.magics["line"].get("debug"), "_nblaunch", False):
        return
    from IPython.core.magics.execution import ExecutionMagics

    # IPython's own, from its instance (the table may hold a lazy stand-in that looks "debug" up again)
    magics = shell.magics_manager.registry.get("ExecutionMagics") or ExecutionMagics(shell)
    original = magics.debug

    def debug(line="", cell=None, local_ns=None):
        error = getattr(sys, "last_value", None)
        if not line.strip() and cell is None and isinstance(error, WorkerError):
            post_mortem = getattr(error, "post_mortem", None)
            if callable(post_mortem):
                return post_mortem()
            print(live_hint(error) if _from_live_session(error) else one_shot_hint(error))
            return None
        return original(line, cell, local_ns=local_ns) if cell is not None else original(line, local_ns=local_ns)

    debug.needs_local_scope = True
    debug._nblaunch = True
    debug.__doc__ = original.__doc__
    shell.register_magic_function(debug, magic_kind="line_cell", magic_name="debug")
