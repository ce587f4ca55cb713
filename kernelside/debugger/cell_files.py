"""The file JupyterLab's debugger knows a notebook cell by, for a ``%%distributed`` cell's ranks.

The panel sets a cell's breakpoints on a file named after a hash of the cell's text (ipykernel's
``dumpCell``: Murmur2 of the text, under the kernel's ``tmpFilePrefix``; ``debugInfo`` says which). A rank
that compiles the cell under that name, with the cell's lines where the notebook numbers them (the
``%%distributed`` line is line 1), stops on those breakpoints, and the panel's call stack opens the cell.

Example::

    debugged_cell_file("x = rank\\n")   # ('/tmp/ipykernel_4242/2871064183.py', 1) in a debugged cell; None else
"""

from __future__ import annotations

import os

from ..kernel_shell import running_shell
from .kernel_proxy import ranks_debugger_address


def debugged_cell_file(body: str) -> tuple[str, int] | None:
    """(the debugger's file name for the running cell, lines above ``body`` in it) while the ranks of a launch
    are debugged; None otherwise (then ranks name the cell ``<%%distributed cell In[N]>``)."""
    if not ranks_debugger_address():
        return None
    raw = _running_cell_text()
    if not raw or body.rstrip("\n") not in raw:
        return None  # not run from a notebook cell (a cell_magic call): nothing in the panel names it
    from ipykernel.compiler import get_file_name

    path = get_file_name(raw)
    if not os.path.exists(path):  # (the panel wrote it with dumpCell when the breakpoint was set)
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(raw)
    return path, raw[: raw.rindex(body.rstrip("\n"))].count("\n")


def _running_cell_text() -> str | None:
    """The running cell's text exactly as the notebook sent it (what the panel hashed): the execute request's
    code. (IPython's history keeps it stripped of trailing newlines, which changes the hash.)"""
    kernel = getattr(running_shell(), "kernel", None)
    try:
        parent = kernel.get_parent()
    except Exception:  # noqa: BLE001 - no kernel, or an ipykernel without it: no cell the panel knows
        return None
    code = (parent or {}).get("content", {}).get("code")
    return code if isinstance(code, str) else None
