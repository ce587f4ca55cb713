"""The file JupyterLab's debugger knows a notebook cell by, for a ``%%distributed`` cell's ranks.

The panel sets a cell's breakpoints on a file named after a hash of the cell's text (ipykernel's
``dumpCell``: Murmur2 of the text, under the kernel's ``tmpFilePrefix``; ``debugInfo`` says which). A rank
that compiles the cell under that name, with the cell's lines where the notebook numbers them (the
``%%distributed`` line is line 1), stops on those breakpoints, and the panel's call stack opens the cell.

Example::

    debugged_cell_file("x = rank\\n", "%%distributed -n 2\\nx = rank\\n")
    # ('/tmp/ipykernel_4242/2871064183.py', 1) while ranks are debugged; None else
"""

from __future__ import annotations

import os

from .kernel_proxy import ranks_debugger_address


def debugged_cell_file(body: str, raw: str | None, stops_itself: bool = False) -> tuple[str, int] | None:
    """(the debugger's file name for the running cell, lines above ``body`` in it) while the ranks of a launch
    are debugged; None otherwise (then ranks name the cell ``<%%distributed cell In[N]>``). ``raw``: the running
    cell's whole text as the notebook sent it (``kernel_shell.running_cell_text``); ``stops_itself``: it
    calls ``breakpoint()`` (``kernel_proxy.ranks_debugger_address``)."""
    if not ranks_debugger_address(stops_itself):
        return None
    if not raw or body.rstrip("\n") not in raw:
        return None  # not run from a notebook cell (a cell_magic call): nothing in the panel names it
    from ipykernel.compiler import get_file_name

    path = get_file_name(raw)
    if not os.path.exists(path):  # (the panel wrote it with dumpCell when the breakpoint was set)
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(raw)
    return path, raw[: raw.rindex(body.rstrip("\n"))].count("\n")
