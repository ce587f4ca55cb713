"""``%debug`` after a failed live cell: a post-mortem in the root-cause rank's own frame, in the cell.

A live rank keeps the traceback of its last failed request (``keep``), as IPython keeps
``sys.last_traceback``. When the kernel asks (a ``debug`` request, ``live.post_mortem``), the rank
opens the rank's debugger on it (``worker.rank_debugger``: its prompts, labelled ``(rank 1) (Pdb)``,
and its output reach the cell through the kernel's stdin, ``worker.rank_stdin``), starting at the
frame that raised, with only the user's frames on the stack (no nblaunch frames: ``up`` stops at
the cell). ``q`` ends the post-mortem; the rank is idle again with its namespace as it was.

Example (in a rank, serving the kernel's ``debug`` request)::

    >>> keep(3, exc)                                   # doctest: +SKIP  (request 3 failed)
    >>> post_mortem(3, rank=1)                          # doctest: +SKIP  (answered in the cell)
"""

from __future__ import annotations

import pdb

from ..short_traceback import is_nblaunch_file

# One rank serves one session: its last failure is what %debug opens (IPython keeps sys.last_traceback too).
_last: dict = {"req": None, "tb": None}


def keep(req_id: int, exc: BaseException) -> None:
    """Remember the traceback of request ``req_id``'s failure (the previous one is let go)."""
    _last["req"], _last["tb"] = req_id, exc.__traceback__


def user_traceback(tb):
    """The traceback from the first frame that is not nblaunch's own (the cell, or the user's function)."""
    while tb is not None and is_nblaunch_file(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return tb


def post_mortem(req_id: int, rank: int) -> None:
    """pdb on request ``req_id``'s failure, answered in the notebook; returns when the user quits or continues."""
    tb = user_traceback(_last["tb"]) if _last["req"] == req_id else None
    if tb is None:
        print(f"nblaunch: rank {rank} has no traceback of that cell to debug (a later cell replaced it).", flush=True)
        return
    debugger = pdb.Pdb()  # this rank's (rank_debugger.install): prompts and output go to the cell
    try:
        debugger.reset()
        debugger.interaction(None, tb)
    except Exception as e:  # the frontend cannot answer (nbclient, papermill: allow_stdin is off)
        if type(e).__name__ != "StdinNotImplementedError":
            raise
        print(
            f"nblaunch: %debug on rank {rank} needs a frontend that answers input (JupyterLab, Notebook); "
            "this one cannot (stdin is not allowed here). Every rank keeps its state.",
            flush=True,
        )
