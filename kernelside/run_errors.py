"""The errors of a run whose ranks started: ``WorkerError`` (a rank failed), ``LaunchTimeoutError`` and
``LaunchStoppedError``. They are torch's ``ChildFailedError`` too, which is why they sit apart from
``errors.py`` (which the torch-free config schema and the Jupyter server import); users import them
from ``kernelside`` or ``kernelside.errors`` as before.

Example::

    >>> from kernelside.errors import WorkerError
    >>> WorkerError("rank 1 failed", rank=1, failures=[]).rank
    1
"""

from __future__ import annotations

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from .short_traceback import ShortTraceback as _ShortTraceback


class WorkerError(_ShortTraceback, ChildFailedError, RuntimeError):
    """A worker rank failed. ``rank`` is the root cause; ``report`` is the run report (every failure,
    exit codes, timings, log paths) of the failed run.

    It is also torch's ``ChildFailedError``, as Accelerate's ``notebook_launcher`` raises: code that
    catches that keeps working, and ``failures`` maps each failed rank to a torch ``ProcessFailure``.

    Example::

        >>> try:                                                           # doctest: +SKIP
        ...     notebook_launcher(train, num_processes=2)
        ... except WorkerError as e:
        ...     print(e.rank, e.report.root_cause().traceback)
    """

    def __init__(self, message: str, *, rank: int | None, failures: list, report=None):
        # ChildFailedError.__init__ would format torch's own message; ours says more, so set its fields directly
        RuntimeError.__init__(self, message)
        self.name = "nblaunch"
        self.rank = rank
        self.report = report
        self.failures = _process_failures(failures, report, rank)

    @property
    def remote_traceback(self) -> str | None:
        for f in self.report.failures if self.report is not None else ():
            if f.rank == self.rank:
                return f.traceback
        return None


def _process_failures(failures: list, report, root: int | None) -> dict:
    """nblaunch's failures as torch's ``{rank: ProcessFailure}``: exit code (negative signal), pid, message.

    The root cause has the earliest timestamp, so torch's ``get_first_failure()`` names it too.
    """
    pids = {r.rank: r.pid for r in getattr(report, "ranks", ())}
    out = {}
    for f in sorted(failures, key=lambda f: f.rank != root):
        if f.rank is None or f.rank in out:
            continue
        status = f.status
        code = (-status.signal if status.signal is not None else status.exitcode) if status else 1
        pf = ProcessFailure(local_rank=f.rank, pid=pids.get(f.rank, -1), exitcode=code, error_file="")
        pf.message, pf.timestamp = f.message, pf.timestamp + len(out)
        out[f.rank] = pf
    return out


class LaunchTimeoutError(WorkerError, TimeoutError):
    """The run took longer than its ``timeout``; every rank was stopped."""


class LaunchStoppedError(WorkerError):
    """The run was stopped from the launch panel (its Stop button or ``POST /nblaunch/runs/<id>/stop``);
    every rank was stopped and nothing is left running. ``rank`` is None: no rank failed."""


# Their public home is kernelside.errors (pickles and tracebacks name them there, as before this split).
for _cls in (WorkerError, LaunchTimeoutError, LaunchStoppedError):
    _cls.__module__ = "kernelside.errors"
