"""In a rank: its own debugger, connected to the kernel while JupyterLab's debugger panel could stop it.

Only a rank told so (its spec carries the kernel's address, ``kernel_proxy.ranks_debugger_address``) imports
debugpy at all. ``connect`` returns once the kernel has configured this rank's debugger (breakpoints and
exception filters as the panel has them): from the first line of user code on, a breakpoint stops it.

While this rank is debugged its peers wait for it as long as a person looks at it: the collective timeout
user code asks for (``init_process_group(timeout=5s)``) does not lower nblaunch's long one (``group_owner``).

A rank that cannot reach the kernel's debugger says so in one line and runs undebugged.

Example::

    connect("127.0.0.1:41233:3f0c…", rank=1)     # (worker.lifecycle.start_rank does this)
"""

from __future__ import annotations

import os
import sys

# Global on purpose: a process has one debugger, and this rank's is connected or not (group_owner reads it).
_connected: list = []


def debugged() -> bool:
    """This rank's debugger is connected to the kernel: a person may hold it stopped for minutes."""
    return bool(_connected)


def connect(address: str, rank: int) -> bool:
    """Connect this rank's debugpy to the kernel at ``address`` (``host:port:secret``); True when connected."""
    host, port, secret = address.split(":", 2)
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # (its frozen-modules note, on every rank)
    try:
        import debugpy

        debugpy.configure(subProcess=False)  # a DataLoader worker is no rank: it never connects back
        # (the access token names this rank to the kernel, and proves it is the kernel's own)
        debugpy.connect((host, int(port)), access_token=f"{secret}:{rank}")
    except Exception as e:  # noqa: BLE001 - debugging is a help, never a reason for a rank to fail
        print(f"nblaunch: rank {rank} runs without JupyterLab's debugger ({type(e).__name__}: {e})", file=sys.stderr)
        return False
    _connected.append(address)
    return True
