"""A rank's answer to "where are you?": every thread's Python stack, dumped on a signal.

``install(path)`` registers ``faulthandler`` for ``STACKS_SIGNAL`` into ``path`` (the rank's
``rank<N>.stacks`` in the run folder). faulthandler's handler is C code that needs no GIL, so the
dump happens even while the main thread is blocked in a C-level collective. The file is made
under a temporary name and renamed into place once the handler is registered: the kernel signals
only ranks whose file exists, so it never sends the signal (whose default action ends the
process) before the rank can take it. Its first line names the main thread
(``launch/rank_stacks.py`` reads it).

Example::

    >>> install(stacks_path(run_dir, 0))      # doctest: +SKIP  (start_rank does this)
"""

from __future__ import annotations

import faulthandler
import os
import signal
import threading

from ..run_contract import rank_stacks_name

STACKS_SIGNAL = signal.SIGRTMIN + 5  # a real-time signal: SIGUSR1/2 belong to users (SLURM, Lightning)
HEADER = "nblaunch-stacks main=0x"  # first line of a rank's file: which thread is its main thread


def stacks_path(run_dir: str, rank: int) -> str:
    """Where rank ``rank`` of the run in ``run_dir`` dumps its stacks (the rank and the kernel agree on it)."""
    return os.path.join(run_dir, rank_stacks_name(rank))


def install(path: str) -> None:
    """Dump every thread's stack into ``path`` whenever this process receives ``STACKS_SIGNAL``."""
    if not path:
        return
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC, 0o600)
    f = os.fdopen(fd, "w")
    f.write(f"{HEADER}{threading.main_thread().ident:x}\n")
    f.flush()
    # faulthandler keeps a reference to f: it stays open for the rank's life
    faulthandler.register(STACKS_SIGNAL, file=f, all_threads=True, chain=False)
    os.replace(tmp, path)
