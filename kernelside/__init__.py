"""nblaunch's kernel side: run distributed PyTorch from a notebook.

    >>> from kernelside import notebook_launcher
    >>> notebook_launcher(train, args=(cfg,), num_processes=2)      # doctest: +SKIP

or, in IPython / Jupyter, ``%load_ext kernelside`` and a cell starting ``%%distributed -n 2``.

The folders follow the process boundary: ``launch/`` runs in the kernel (config → plan → engine →
recorder), ``engines/`` are the ways ranks run (local processes, torch's elastic launcher, Ray
Train), ``worker/`` runs inside each rank, ``display/`` draws in the kernel, ``notebook/`` holds
the magics, and ``config/`` the one schema.
"""

import sys

from .errors import LaunchConfigError, LaunchError, LaunchStoppedError, LaunchTimeoutError, WorkerError
from .launch import cuda_guard as _cuda_guard
from .launch import warmup as _warmup
from .launch.launcher import notebook_launcher
from .launch.runner import last_report
from .worker.context import current as _current_worker
from .worker.progress import log_metrics, progress

_cuda_guard.install()  # from now on, remember where CUDA is first initialized in this process


def _in_jupyter_kernel() -> bool:
    ip_mod = sys.modules.get("IPython")
    shell = ip_mod.get_ipython() if ip_mod is not None else None
    return getattr(shell, "kernel", None) is not None


def _warm_up_after_this_cell(*_args) -> None:
    """Start the background import once the cell that loaded kernelside has finished (so that neither this
    import nor %load_ext competes with it), while the user works on the next cells."""
    sys.modules["IPython"].get_ipython().events.unregister("post_run_cell", _warm_up_after_this_cell)
    _warmup.start()  # what forked ranks inherit


if _in_jupyter_kernel():
    sys.modules["IPython"].get_ipython().events.register("post_run_cell", _warm_up_after_this_cell)

__all__ = [
    "notebook_launcher",
    "last_report",
    "progress",
    "log_metrics",
    "LaunchConfigError",
    "LaunchError",
    "LaunchStoppedError",
    "LaunchTimeoutError",
    "WorkerError",
    "load_ipython_extension",
    "worker_context",
    "start",
]


def start(num_processes=None, **options):
    """Start live ranks that stay up across calls; ``ranks.run(fn, args=...)`` returns rank 0's value.

    >>> with start(num_processes=2) as ranks:       # doctest: +SKIP
    ...     ranks.run(train, args=(cfg,))
    """
    from .live.ranks import start as start_live

    return start_live(num_processes, **options)


def worker_context():
    """Inside a worker: rank, local_rank, world_size and device of this worker; None in the kernel."""
    return _current_worker()


def load_ipython_extension(ipython):
    from .notebook.magics import register

    register(ipython)
