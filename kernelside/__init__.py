"""nblaunch's kernel side: run distributed PyTorch from a notebook.

    >>> from kernelside import notebook_launcher
    >>> notebook_launcher(train, args=(cfg,), num_processes=2)      # doctest: +SKIP

or, in IPython / Jupyter, ``%load_ext kernelside`` and a cell starting ``%%distributed -n 2``.

The folders follow the process boundary: ``launch/`` runs in the kernel (config → plan → engine →
recorder), ``engines/`` are the ways ranks run (local processes, torch's elastic launcher, Ray
Train), ``worker/`` runs inside each rank, ``display/`` draws in the kernel, ``notebook/`` holds
the magics, and ``config/`` the one schema. ``run_contract.py`` is what the Jupyter server shares
with the kernel (run folders, state file, states).

Importing the package does not import torch: the public names load on first use (PEP 562), so the
Jupyter server, which reads the config schema and the run contract, never loads torch. In a kernel,
``%load_ext kernelside`` loads the magics (and torch) at once, and a background import of what forked
ranks inherit starts after the loading cell.
"""

import importlib

from .engines import warmup as _warmup
from .errors import LaunchConfigError, LaunchError
from .kernel_shell import running_shell
from .launch import cuda_guard as _cuda_guard

# where CUDA is first initialized in this process is recorded from now on (when torch.cuda loads)
_cuda_guard.install_when_torch_loads()

# public name -> the module that defines it, imported on first use
_LAZY = {
    "notebook_launcher": ".launch.launcher",
    "last_report": ".launch.runner",
    "progress": ".worker.progress",
    "log_metrics": ".worker.progress",
    "LaunchStoppedError": ".errors",
    "LaunchTimeoutError": ".errors",
    "WorkerError": ".errors",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kernelside' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


def _in_jupyter_kernel() -> bool:
    return getattr(running_shell(), "kernel", None) is not None


def _warm_up_after_this_cell(*_args) -> None:
    """Start the background import once the cell that loaded kernelside has finished (so that neither this
    import nor %load_ext competes with it), while the user works on the next cells."""
    running_shell().events.unregister("post_run_cell", _warm_up_after_this_cell)
    _warmup.start()  # what forked ranks inherit
    from .engines import forkserver

    forkserver.prestart_if_useful()  # what ranks started after CUDA is up are forked from


if _in_jupyter_kernel():
    running_shell().events.register("post_run_cell", _warm_up_after_this_cell)

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
    from .worker.context import current

    return current()


def load_ipython_extension(ipython):
    from .debugger.undebugged import import_undebugged

    import_undebugged(f"{__name__}.notebook.magics")  # (torch's import, untraced with JupyterLab's debugger on)
    from .debugger.kernel_proxy import install
    from .notebook.magics import register

    register(ipython)
    if getattr(ipython, "kernel", None) is not None:
        install(ipython.kernel)  # JupyterLab's debugger panel reaches the ranks too
