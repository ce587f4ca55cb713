"""Exceptions users handle. Each message says what happened, where, and what to do."""

from __future__ import annotations

from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure


class _ShortTraceback:
    """IPython shows ``_render_traceback_()`` instead of the stack: for these errors the stack
    is nblaunch's own plumbing, and the message already says what, where and what to do."""

    def _render_traceback_(self) -> list[str]:
        red, reset = "\x1b[31m", "\x1b[0m"
        lines = str(self).splitlines() or [""]
        return [f"{red}{type(self).__name__}{reset}: {lines[0]}", *lines[1:]]


class LaunchConfigError(_ShortTraceback, ValueError):
    """A launch argument, magic flag or config value is invalid; nothing was started.

    ``key``, ``value`` and ``allowed`` name the offending setting, ``path`` the file it came from, ``source``
    any other place it came from (``the flag --port``, ``notebook_launcher(use_port=...)``).
    """

    def __init__(
        self, key, value, allowed, *, message: str | None = None, path: Path | None = None, source: str | None = None
    ):
        self.key, self.value, self.allowed, self.path, self.source = key, value, allowed, path, source
        self._message = message
        super().__init__()

    @property
    def allowed_message(self) -> str:
        if self._message:
            return self._message
        return f"got {self.value!r}; allowed: {self.allowed}"

    def __str__(self):
        if self._message:
            return self._message
        where = f" (in {self.path})" if self.path else f" (from {self.source})" if self.source else ""
        return f"invalid {self.key}={self.value!r}{where}: allowed is {self.allowed}. Nothing was started."


class LaunchError(_ShortTraceback, RuntimeError):
    """The launch could not start (no free port, fork not possible, ...); nothing is left running."""


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


class CellInterrupted(_ShortTraceback, KeyboardInterrupt):
    """■ during a run (a one-shot launch or a live session's cell): a KeyboardInterrupt whose message says what
    happened to the ranks (IPython shows it at once, instead of formatting the stack of nblaunch's loop)."""


# What the notebook shows as the error's name: it is a KeyboardInterrupt, and is caught as one.
CellInterrupted.__name__ = CellInterrupted.__qualname__ = "KeyboardInterrupt"
