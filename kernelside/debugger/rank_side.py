"""In a rank: its own debugger, connected to the kernel while JupyterLab's debugger panel could stop it.

Only a rank told so (its spec carries the kernel's address, ``kernel_proxy.ranks_debugger_address``) imports
debugpy at all. ``connect`` returns once the kernel has configured this rank's debugger (breakpoints and
exception filters as the panel has them): from the first line of user code on, a breakpoint stops it.

While this rank is debugged its peers wait for it as long as a person looks at it: the collective timeout
user code asks for (``init_process_group(timeout=5s)``) does not lower nblaunch's long one (``group_owner``).

A rank that cannot reach the kernel's debugger says so in one line and runs undebugged.

The panel's rich view of a variable and its "Copy Variable to Globals" are answered in a stopped frame of the
rank by ``worker.debug_values`` (``kernel_proxy`` evaluates it there, as ipykernel evaluates its own): worker
code, kept out of this module, which imports only the standard library.

Example::

    connect("127.0.0.1:41233:3f0c…", rank=1)     # (worker.lifecycle.start_rank does this)
"""

from __future__ import annotations

import os
import sys
import threading

from .undebugged import undebugged

CONFIGURE_WAIT_S = 60.0

# Global on purpose: a process has one debugger, and this rank's is connected or not (group_owner reads it).
_connected: list = []


def debugged() -> bool:
    """This rank's debugger is connected to the kernel: a person may hold it stopped for minutes."""
    return bool(_connected)


def connect(address: str, rank: int, wait_s: float = CONFIGURE_WAIT_S) -> bool:
    """Connect this rank's debugpy to the kernel at ``address`` (``host:port:secret``); True when connected
    and configured. A kernel that does not configure it within ``wait_s`` leaves it undebugged (one line)."""
    host, port, secret = address.split(":", 2)
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # (its frozen-modules note, on every rank)
    try:
        import debugpy.server.api  # noqa: F401 - pydevd set up as debugpy sets it (DAP over the socket)
        import pydevd

        # as debugpy.connect() does, but the wait for the kernel's configurationDone is bounded (debugpy's is
        # not: a kernel that closed the connection first would leave the rank waiting for ever). The access
        # token names this rank to the kernel, and proves it is the kernel's own.
        pydevd.settrace(
            host=host,
            port=int(port),
            client_access_token=f"{secret}:{rank}",
            suspend=False,
            patch_multiprocessing=False,  # a DataLoader worker is no rank: it never connects back
            wait_for_ready_to_run=False,
            stdout_to_server=False,  # the rank's output already reaches the cell through its pipes
            stderr_to_server=False,
            dont_trace_start_patterns=(os.path.dirname(debugpy.__file__),),
        )
        if not _configured(wait_s):
            pydevd.stoptrace()
            raise TimeoutError(f"the kernel did not configure it in {wait_s:.0f}s")
    except Exception as e:  # noqa: BLE001 - debugging is a help, never a reason for a rank to fail
        print(f"nblaunch: rank {rank} runs without JupyterLab's debugger ({type(e).__name__}: {e})", file=sys.stderr)
        return False
    _connected.append(address)
    _stop_in_panel_on_breakpoint()
    return True


def _stop_in_panel_on_breakpoint() -> None:
    """``breakpoint()`` in this rank stops in the panel on the next line, as in a plain cell of the kernel
    (where debugpy's hook makes it a stop); the hook it replaces (pdb through the notebook's stdin,
    ``worker.rank_stdin``) answers it again once the panel is gone (the debugger switched off)."""
    before = sys.breakpointhook

    def panel_breakpoint(*args, **kwargs):
        import pydevd

        if os.environ.get("PYTHONBREAKPOINT") or not pydevd._is_attached():  # (a user's own hook is theirs)
            return before(*args, **kwargs)
        pydevd.settrace(  # as debugpy.breakpoint(): a stop in the caller's frame, this thread only
            suspend=True,
            trace_only_current_thread=True,
            patch_multiprocessing=False,
            stop_at_frame=sys._getframe(1),
            notify_stdin=False,
        )

    sys.breakpointhook = panel_breakpoint


def _configured(wait_s: float) -> bool:
    """pydevd's own wait for the kernel's configurationDone (debugpy.wait_for_client's), bounded by a timer."""
    import pydevd

    cancel = threading.Event()
    timer = threading.Timer(wait_s, cancel.set)
    undebugged(timer).start()
    try:
        pydevd._wait_for_attach(cancel=cancel)
    finally:
        timer.cancel()
    return pydevd._is_attached()
