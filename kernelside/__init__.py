"""nblaunch's kernel side: run distributed PyTorch from a notebook.

    >>> from kernelside import notebook_launcher
    >>> notebook_launcher(train, args=(cfg,), num_processes=2)      # doctest: +SKIP

or, in IPython / Jupyter, ``%load_ext kernelside`` and a cell starting ``%%distributed -n 2``.
"""

from . import cuda_guard as _cuda_guard
from .engine import last_report
from .errors import LaunchConfigError, LaunchError, LaunchStoppedError, LaunchTimeoutError, WorkerError
from .launcher import notebook_launcher
from .progress import log_metrics, progress

_cuda_guard.install()  # from now on, remember where CUDA is first initialized in this process

__all__ = [
    "notebook_launcher",
    "last_report",
    "progress",
    "log_metrics",
    "LaunchConfigError",
    "LaunchError",
    "LaunchTimeoutError",
    "LaunchStoppedError",
    "WorkerError",
    "load_ipython_extension",
    "worker_context",
]


def worker_context():
    """Inside a worker: rank, local_rank, world_size and device of this worker; None in the kernel."""
    from . import worker

    return worker.CURRENT


def load_ipython_extension(ipython):
    from .magics import register

    register(ipython)
