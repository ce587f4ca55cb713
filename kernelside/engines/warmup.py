"""Pay once, in the kernel and in the background, what every forked rank would otherwise pay.

A rank's first DDP construction imports ``torch._dynamo`` (about 2.7 s per process here). Imported
once in the kernel before the fork, every forked rank inherits it. ``start()`` begins that import
in a background thread once the cell that loaded ``kernelside`` in a kernel has finished, so the
user does not wait for it; ``ensure()`` (called before any fork of ours) joins it, or does it, so that a fork never
happens while another thread holds an import lock. A fork hook makes the same join for forks that
are not ours.

Example::

    >>> start()      # after the cell that loaded kernelside   # doctest: +SKIP
    >>> ensure()     # before forking workers
"""

from __future__ import annotations

import os
import threading

from .. import interrupts
from ..debugger.undebugged import undebugged

JOIN_POLL_S = 0.05  # how often a launch waiting for the imports looks for ■


class _Warmup:
    """The background import: its thread, whether it is done, and the lock that starts it once."""

    def __init__(self):
        self.thread: threading.Thread | None = None
        self.done = False
        self.lock = threading.Lock()


# Global on purpose: imports are per process, and the at-fork hook below (which takes no arguments) must see it.
WARMUP = _Warmup()


def _import() -> None:
    from ..worker import before_fork
    from ..worker.warm_imports import import_rank_modules

    import_rank_modules()
    before_fork.look()  # the walks each forked rank would otherwise make of every loaded module
    try:  # the launch plan asks Accelerate's launcher for the ranks' ACCELERATE_* variables (accelerate_env.py)
        import accelerate.commands.launch  # noqa: F401
    except Exception:
        pass


def _run() -> None:
    try:
        _import()
    finally:
        WARMUP.done = True


def start() -> None:
    """Begin the imports in a daemon thread (once per process; a no-op when already done or started)."""
    with WARMUP.lock:
        if WARMUP.done or WARMUP.thread is not None:
            return
        t = undebugged(threading.Thread(target=_run, name="nblaunch-warmup", daemon=True))
        WARMUP.thread = t
        t.start()


def ensure() -> None:
    """Return once the imports are done, in the background thread (started now if it was not): ■ meanwhile
    stops the launch at once (``interrupts.check``) and the imports go on, whole, for the next launch."""
    if WARMUP.done:
        return
    start()
    t = WARMUP.thread
    if t is threading.current_thread():
        return
    while t.is_alive():
        t.join(JOIN_POLL_S)
        interrupts.check()


def _before_fork() -> None:
    # a fork while the warm-up thread holds an import lock would leave the child's lock held forever
    t = WARMUP.thread
    if t is not None and not WARMUP.done and t is not threading.current_thread():
        t.join()


os.register_at_fork(before=_before_fork)
