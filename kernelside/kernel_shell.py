"""The kernel's IPython shell, found without importing IPython, and what nblaunch asks of it.

Torch-free and IPython-free: every floor that needs the shell (the display's cell output, the Runs view's
cell link, a live session's io loop, the CUDA guard's cell names) looks it up here, never by hand.
``running_shell()`` is None in a plain script and in a rank.

The name a rank's traceback gives the cell is the execution count the notebook shows beside it.

IPython 9 counts a cell before running it (``shell.execution_count`` is already the next cell's number while
it runs); older IPython counts after. The input history has the running cell stored last either way, so its
index is the count the notebook shows.

Example::

    >>> cell_label(get_ipython())  # in the cell the notebook shows as [10]   # doctest: +SKIP
    'In[10]'
"""

from __future__ import annotations

import sys
import threading


def running_shell():
    """IPython's running shell, or None: IPython not imported (never imported here), or no shell running."""
    ipython = sys.modules.get("IPython")
    get = getattr(ipython, "get_ipython", None)  # a half-imported IPython (an import in progress) has none yet
    return get() if get is not None else None


def notebook_namespace() -> dict:
    """The notebook's namespace: IPython's user namespace, else ``__main__``'s (a script)."""
    shell = running_shell()
    return shell.user_ns if shell is not None else vars(sys.modules["__main__"])


def kernel_io_loop():
    """The Jupyter kernel's tornado io loop, or None outside a kernel."""
    return getattr(getattr(running_shell(), "kernel", None), "io_loop", None)


def call_in_kernel_thread(fn) -> None:
    """Call ``fn`` (a widget update) in the kernel's main thread: now, or from another thread (the panel's Stop)
    on the kernel's event loop, which runs it between cells at once. (A widget message sent from that thread
    itself would open sockets of the thread in the kernel, which outlive it.) Without a kernel loop nothing
    shows widgets: nothing to do."""
    if threading.current_thread() is threading.main_thread():
        fn()
        return
    loop = kernel_io_loop()
    if loop is not None:
        loop.add_callback(fn)


def running_cell_count(shell) -> int:
    """The execution count of the cell running now, as the notebook shows it."""
    count = shell.execution_count
    history = getattr(shell, "history_manager", None)
    stored = len(history.input_hist_raw) - 1 if history is not None else None
    # stored is this cell's index in the history, unless the cell was run without storing history
    return stored if stored in (count, count - 1) else count


def cell_label(shell) -> str:
    """``In[N]`` for the running cell: the file name its code has in a rank's traceback."""
    return f"In[{running_cell_count(shell)}]"


def running_cell_text() -> str | None:
    """The running cell's text exactly as the notebook sent it: the execute request's code (what JupyterLab's
    debugger hashes to name the cell's file; IPython's history keeps it stripped of trailing newlines)."""
    kernel = getattr(running_shell(), "kernel", None)
    try:
        parent = kernel.get_parent()
    except Exception:  # noqa: BLE001 - no kernel, or an ipykernel without it: no cell text to give
        return None
    code = (parent or {}).get("content", {}).get("code")
    return code if isinstance(code, str) else None
