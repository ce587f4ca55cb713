"""``%debug`` after a failed live cell opens the root-cause rank's own frame, not nblaunch's.

IPython's ``%debug`` calls ``shell.debugger(force=True)``, which opens pdb on
``sys.last_traceback``. For a live cell's ``WorkerError`` that traceback is the kernel's (the
launch's ``raise``), and the frame that failed lives in a rank. ``install()`` wraps the shell's
``debugger`` once: when the exception being debugged is the live session's last cell failure, the
session asks the root-cause rank for a post-mortem (``LiveSession.post_mortem``, answered in the
cell: ``worker.live_debug``); any other exception goes to IPython's own debugger, unchanged.

Example::

    >>> install(get_ipython())        # doctest: +SKIP  (once, when a live session starts)
"""

from __future__ import annotations

import sys

from . import registry


def install(shell) -> None:
    """Wrap ``shell.debugger`` (idempotent); a shell-less process (plain Python) has nothing to wrap."""
    if shell is None or getattr(shell.debugger, "_nblaunch", False):
        return
    ipython_debugger = shell.debugger

    def debugger(force=False):
        session = registry.current()
        value = getattr(sys, "last_value", None)
        if force and session is not None and session.world.up and session.owns_failure(value):
            session.post_mortem()
            return None
        return ipython_debugger(force)

    debugger._nblaunch = True
    debugger.__doc__ = ipython_debugger.__doc__
    shell.debugger = debugger
