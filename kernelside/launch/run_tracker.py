"""What the launch panel needs from one launch, in one object the engine holds for the run:
its ``state.json`` (``run_state.RunStateWriter``), its curves and pace (``run_series.RunSeries``) and,
for engines whose loop is ours, its Stop channel (``run_control.RunControl``).

The engine wraps a launch in ``track_run()``; the kernel loop calls ``attach()`` once and
``tick(report)`` on every turn (a compare of a few fields unless something changed or
``WRITE_EVERY_S`` passed); leaving the ``with`` block writes the final state, whatever
ended the run, and removes the control socket.

Example::

    >>> with track_run(log_dir, plan, last_report) as tracker:     # doctest: +SKIP
    ...     loop = EventLoop(..., tracker=tracker)                  # attach(), tick() inside
    ...     loop.run()
"""

from __future__ import annotations

import contextlib
import os

from . import rank_stacks
from .run_control import RunControl
from .run_series import RunSeries
from .run_state import RunStateWriter


class RunTracker:
    """State file and control channel of one run; see the module docstring."""

    def __init__(self, writer: RunStateWriter, control: RunControl | None):
        self.writer, self.control = writer, control
        self.series = RunSeries(writer.run_dir)  # the dashboard's curves and pace (run_series.py)

    def attach(self, sel, on_stop, on_stacks=None) -> None:
        """Serve Stop from ``sel``'s loop; ``on_stop()`` stops the run (True) or says it is already stopping;
        ``on_stacks()`` names the ranks to ask for their stacks (``RunControl.register``)."""
        if self.control is not None:
            self.control.register(sel, on_stop, on_stacks)

    def event(self, rank: int, kind: str, payload) -> None:
        """A worker's metrics or progress event, for the dashboard's curves and each rank's pace."""
        self.series.event(rank, kind, payload)

    def tick(self, report) -> None:
        """Called on every turn of the kernel loop; writes only on change or every WRITE_EVERY_S."""
        self.writer.update(report)

    def finish(self, report, error: BaseException | None) -> None:
        if self.control is not None:
            self.control.close()  # first: a Stop from now on finds no owner instead of no answer
        rank_stacks.remove_files(self.writer.run_dir)
        self.writer.update(report, final=True, error=error)


def rank_gpus(plan) -> dict:
    """rank -> the GPU it computes on, as the machine names it (the rank's entry of CUDA_VISIBLE_DEVICES)."""
    if plan.engine != "local" or not plan.gpu_ids:
        return {}
    visible = [g for g in plan.base_env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]
    return {r: visible[r % len(visible)] for r in range(plan.num_processes)} if visible else {}


@contextlib.contextmanager
def track_run(run_dir: str, plan, current_report):
    """A ``RunTracker`` for the launch in ``run_dir``; ``current_report()`` returns the engine's latest report.

    The report counts only if it belongs to this run folder (an engine that failed before
    making one leaves the previous launch's report there).
    """
    engine = plan.engine
    control = None
    if engine == "local":  # ray, elastic: their loops are not ours, so they take no Stop from the panel
        try:
            control = RunControl.listen(run_dir)
        except OSError:  # a log_dir on a file system without sockets: the run goes on, without Stop
            control = None
    writer = RunStateWriter(run_dir, engine=engine, has_control=control is not None, gpus=rank_gpus(plan))
    tracker = RunTracker(writer, control)
    error = None
    try:
        writer.update(None)
        yield tracker
    except BaseException as e:
        error = e
        raise
    finally:
        report = current_report()
        if report is not None and os.path.realpath(report.log_dir) != os.path.realpath(run_dir):
            report = None
        tracker.finish(report, error)
