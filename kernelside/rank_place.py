"""Where a rank was, in one sentence shape: the words a one-shot run's and a live session's messages share.

A rank's place comes from its stack: in a one-shot run the kernel asks each rank's stack
(``launch.rank_stacks``), in a live session the rank answers for itself (``worker.live_rescue``).
Both are said here, the same way::

    >>> place_line(1, "cell In[3], line 5", collective="barrier")
    'rank 1: cell In[3], line 5, waiting in torch.distributed.barrier()'
    >>> place_line(0, cell_place("<%%distributed cell In[4]>", 2), calling="sleep")
    'rank 0: cell In[4], line 2, calling sleep()'
"""

from __future__ import annotations

CELL_FILE_PREFIX = "<%%distributed cell "  # a %%distributed cell's code compiles under "<%%distributed cell In[3]>"


def cell_file(cell_label: str) -> str:
    """The file name a %%distributed cell's code is compiled under (``notebook.cell``)."""
    return f"{CELL_FILE_PREFIX}{cell_label}>"


def cell_place(filename: str, lineno: int | None) -> str | None:
    """'cell In[3], line 5' for a line of a %%distributed cell's code; None for any other file."""
    if filename.startswith(CELL_FILE_PREFIX) and filename.endswith(">"):
        return f"cell {filename[len(CELL_FILE_PREFIX) : -1]}, line {lineno}"
    return None


def place_line(
    rank: int,
    where: str | None,
    *,
    collective: str | None = None,
    seq: int | None = None,
    inside: str | None = None,
    calling: str | None = None,
) -> str:
    """'rank N: <where>' and what it waited for there: the collective (with its count when known), else the
    torch function it is inside, else the C function its line calls. ``where`` None: no Python frame."""
    line = f"rank {rank}: {where or 'no Python frame'}"
    if collective:  # a torch.distributed function, or what waits for one ('backward (gradient all-reduce)')
        call = f"torch.distributed.{collective}()" if collective.isidentifier() else collective
        line += f", waiting in {call}"
        if seq is not None:
            line += f" (collective #{seq})"
    elif inside:
        line += f", inside {inside}"
    elif calling:
        line += f", calling {calling}()"
    return line
