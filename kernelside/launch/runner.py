"""The one launch behind ``notebook_launcher()`` and ``%%distributed``.

``launch(request)`` resolves the configuration, makes the plan, and runs it on the engine the
plan names (``engines.table``: local processes, torch's elastic launcher across machines, Ray
Train), with one ``RunRecorder`` that decides the outcome. The first failure (an error event, a
bad exit, a timeout, Ctrl-C) stops every other rank at once — ranks blocked in a collective
included — and the call returns promptly with a ``WorkerError`` naming the root cause.

Example::

    >>> out = launch(LaunchRequest(fn=train, args=(0.1,), arguments={"num_processes": 2}))  # doctest: +SKIP
    >>> out.value, out.report.startup_s
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import threading
import time

from .. import interrupts
from ..config import resolve_config
from ..debugger.kernel_proxy import for_engine as debugger_for_engine
from ..display.deferred_display import deferred_run_display
from ..display.output import RankOutputRouter
from ..display.progress_view import make_run_display, render_mode
from ..display.rank_tabs import make_rank_tabs
from ..engines.table import engine_class
from ..errors import CellInterrupted, LaunchConfigError, LaunchError
from ..run_contract import RunState
from ..worker.context import current as current_worker
from . import cuda_guard, hardware, rank_stacks
from .gpu_usage import sampler_for
from .observers import RunObservers
from .payload import Payload
from .plan import make_plan
from .recorder import RunRecorder
from .report import LaunchReport
from .request import LaunchOutcome, LaunchRequest
from .run_dir import run_log_dir
from .run_tracker import track_run

POLL_S = 0.1  # the longest an engine's poll() waits before the deadline and grace are checked again


@dataclasses.dataclass
class _KernelLaunches:
    """This process's launches: one runs at a time, and the last one's report is kept."""

    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    last_report: LaunchReport | None = None


# Global on purpose: the kernel is one process whose launches must not overlap (one rendezvous, one
# cell display), and %distributed_last / kernelside.last_report() ask for the last report from anywhere.
KERNEL_LAUNCHES = _KernelLaunches()


def last_report() -> LaunchReport | None:
    """The report of the most recent launch in this process (success or failure)."""
    return KERNEL_LAUNCHES.last_report


@contextlib.contextmanager
def keeping_last_report():
    """Runs inside the block do not replace ``last_report()`` (a live session's start-up run, say)."""
    kept = KERNEL_LAUNCHES.last_report
    try:
        yield
    finally:
        if kept is not None:
            KERNEL_LAUNCHES.last_report = kept


def plan_for(cfg):
    """The launch plan for a resolved configuration on this machine, as it is right now."""
    return make_plan(
        cfg,
        gpus=hardware.gpu_count(),
        cuda_initialized=cuda_guard.is_cuda_initialized(),
        init_site=cuda_guard.first_init_site(),
    )


@interrupts.deferring()
def launch(req: LaunchRequest) -> LaunchOutcome:
    """Run ``req.fn`` on every rank; return rank 0's value (and all values with ``return_all``).

    ■ at any moment of it is counted, not raised where it lands (``kernelside.interrupts``): the ranks are
    stopped, and the call raises a short ``KeyboardInterrupt``, from the points this module chose."""
    inside = current_worker()
    if inside is not None:
        raise LaunchError(
            f"a launch cannot be started from inside a rank: rank {inside.rank} of a running launch called "
            "notebook_launcher() (or %%distributed). The launched code already runs on every rank with "
            "torch.distributed set up: call the function directly there, or start the launch from a notebook cell."
        )
    if not callable(req.fn):
        raise LaunchConfigError("function", req.fn, "a callable (a function defined in the notebook, say)")
    out = req.stdout or sys.stdout
    err = req.stderr or sys.stderr
    cfg = resolve_config(req.arguments, config=req.config)
    for w in cfg.warnings:
        err.write(f"nblaunch: {w}\n")
    plan = plan_for(cfg)
    cls = engine_class(plan.engine)
    if req.return_rank is not None and req.return_rank >= plan.num_processes:
        raise LaunchConfigError(
            "--return-from", req.return_rank, f"a rank below the number of processes ({plan.num_processes}) or 'all'"
        )
    fn, unreached = debugger_for_engine(plan.engine, req.fn)  # (JupyterLab's debugger: this machine's ranks only)
    if unreached:
        out.write(unreached + "\n")
        req = dataclasses.replace(req, fn=fn)
    # the payload's transport: forked ranks inherit the notebook, the others get the names it reads, pickled
    payload = Payload(req.fn, req.args, req.kwargs, req.namespace, req.describe_args)
    blob = payload.pickled() if plan.start_method in ("spawn", "forkserver") else None
    req = dataclasses.replace(req, fn=payload.callable_for(plan.start_method), namespace=None)
    for notice in plan.notices:
        out.write(notice + "\n")
    interrupts.check()  # ■ during the configuration: nothing has started yet
    if not KERNEL_LAUNCHES.lock.acquire(blocking=False):
        raise LaunchError(
            "another nblaunch launch is already running in this kernel (from another thread); "
            "launches run one at a time. Wait for it to finish, then launch again."
        )
    try:
        with run_log_dir(plan.log_dir) as log_dir, track_run(log_dir, plan, last_report) as tracker:
            engine = cls(req, plan, log_dir, out, err, render=render_mode(plan.output), spawn_blob=blob)
            blob = None
            return run_engine(engine, req, plan, log_dir, out, err, tracker)
    finally:
        KERNEL_LAUNCHES.lock.release()


def run_engine(engine, req: LaunchRequest, plan, log_dir: str, out, err, tracker=None) -> LaunchOutcome:
    """One run of the kernel loop on ``engine`` (``engines.contract.Engine``): report, output routing,
    widgets, recorder, outcome — and the policy, which is this function's alone: the deadline
    (``plan.timeout``), how long ranks get to stop, and what Ctrl-C does.

    ``launch()`` runs each launch through it; a live session runs each cell through it
    (``live.request_engine``), so both share every output, failure and interrupt rule.
    """
    t_call = time.monotonic()
    port = engine.prepare()
    report = LaunchReport(
        world_size=plan.num_processes,
        backend=plan.backend,
        start_method=plan.start_method,  # (the engine says so in start() when it fell back)
        port=port or 0,
        log_dir=log_dir,
        # the run's one clock: the state file's start (the sidebar's and the dashboard's name) names it in the cell too
        started_at=tracker.writer.started if tracker is not None else time.time(),
        engine=plan.engine,
        return_all=req.return_all,
    )
    KERNEL_LAUNCHES.last_report = report
    router = None
    # a live cell draws its display only once there is something to show (display/deferred_display.py)
    make = deferred_run_display if engine.defer_display else make_run_display
    display = make(report, plan.output, plan.progress) if engine.render == "widgets" else None
    ranks = engine.ranks if engine.ranks is not None else range(plan.num_processes)
    tabs = make_rank_tabs(ranks, plan.output, display is not None) if engine.log_tails is None else None
    if engine.log_tails is None:
        router = RankOutputRouter(
            plan.num_processes,
            plan.output,
            log_dir,
            out,
            err,
            prefix_template=req.line_prefix,
            tabs=tabs,
            make_logs=not engine.rank_logs_made,
        )
    observers = _observers(report, router, display, sampler_for(plan.gpu_ids), tracker, req.on_event)
    engine.observe(observers)  # what the engine itself watches (a live request: where its ranks are)
    recorder = RunRecorder(
        report,
        clock=engine.clock,
        router=router,
        stop=engine.stop,
        tails=router or engine.log_tails,
        peer_hint=engine.peer_hint,
        t_call=t_call,
        where=lambda: _where_ranks_were(report, engine),
        observers=observers,
    )
    interrupted = None
    try:
        engine.start(recorder)
        if display is not None:
            display.show()
        if tabs is not None and not (display is not None and display.hold(tabs.widget)):
            tabs.show()
        _watch(engine, recorder, plan.timeout, t_call)
    except KeyboardInterrupt as e:
        # Said before the ranks are stopped (where each one was), raised once they are gone; the stack of
        # this loop is nblaunch's plumbing, so the notebook shows one line saying what became of the ranks.
        waited = recorder.stopping  # ■ while ranks were already stopping (a failure's, a timeout's): no more waiting
        message = None if isinstance(e, CellInterrupted) else _interrupted_message(report, engine)
        recorder.stop_for_interrupt()
        engine.on_interrupt(again=waited)
        if not waited:
            try:
                _watch(engine, recorder, None, t_call)  # the ranks' grace to end (or come back to rest)
            except KeyboardInterrupt:
                engine.on_interrupt(again=True)  # ■ again: no more waiting
        interrupted = engine.interrupt_error(recorder) or (e if message is None else CellInterrupted(message))
    finally:
        # (after Ctrl-C the grace was given above; stopped from the panel: the recorder's shorter one was)
        grace = 0.0 if interrupted or report.state is RunState.STOPPED else engine.stop_grace_s
        engine.close(grace, recorder)
        recorder.close()
        if interrupted is not None:
            recorder.finish_interrupted(interrupted)
    if interrupted is not None:
        raise interrupted from None
    value, values = recorder.outcome(req.return_all)
    return LaunchOutcome(value, values, report)


def _observers(report: LaunchReport, router, display, gpu, tracker, on_event) -> RunObservers:
    """Everything that watches this run besides the recorder, each told what it watches (``launch.observers``)."""
    observers = RunObservers()
    if router is not None:
        observers.on_tick(router.flush_stale)  # a rank's partial line, shown once it has waited a moment
    if gpu is not None:  # per-rank GPU memory and utilization; at ``done`` the rank's memory is still held
        observers.watch(lambda rank, kind, payload: gpu.sample(report.ranks), kinds=("done",))
        observers.on_tick(lambda: gpu.tick(report.ranks, time.monotonic()))
    if display is not None:
        observers.display = display
        observers.watch(display.on_event, kinds=("progress", "metrics"))
        observers.on_tick(display.tick)
        observers.on_finish(display.finish)
    if tracker is not None:  # the Runs view: its state file, and its Stop and stacks served by the engine's loop
        observers.control = tracker
        observers.watch(tracker.event, kinds=("progress", "metrics", "pace"))  # (pace: a hidden rank's bar)
        observers.on_tick(lambda: tracker.tick(report))
    if on_event is not None:
        observers.watch(on_event)
    return observers


def _watch(engine, recorder, timeout: float | None, t_call: float) -> None:
    """Poll ``engine`` until the run is over, applying the deadline and, once stopping, the grace (an engine's
    ``stop_grace_s`` of None: none, its ranks are waited for as long as they live)."""
    deadline = t_call + timeout if timeout else None
    while True:
        now = time.monotonic()
        stopping = recorder.stopping_since
        grace = stop_grace_s(engine, recorder)
        if stopping is not None and grace is not None and now - stopping > grace:
            return  # the engine's close() kills what is left
        if deadline is not None and stopping is None and now >= deadline:
            recorder.timeout(timeout)  # the recorder asks the engine to stop every rank
            continue
        wait = POLL_S if deadline is None or stopping is not None else max(0.0, min(POLL_S, deadline - now))
        if engine.poll(recorder, wait):
            return
        recorder.observers.tick()  # once per turn: partial lines, widget redraws, GPU samples, the Runs view's state
        interrupts.check()  # ■ is acted on here, between two turns of the loop (never where it landed)


def stop_grace_s(engine, recorder) -> float | None:
    """How long stopping ranks get before ``close()`` kills what is left — one value: the engine's own
    (``Engine.stop_grace_s``; None: as long as they live), unless the launch panel's Stop asked for less
    (``recorder.grace_s``, ``RunRecorder.stop_requested``)."""
    return recorder.grace_s or engine.stop_grace_s


def _interrupted_message(report: LaunchReport, engine) -> str:
    """■ during a one-shot run: where each unfinished rank was, that they were stopped and nothing is left running
    (said before they are stopped, raised once they are gone)."""
    where = _where_ranks_were(report, engine)
    return (
        f"the run was interrupted (■): its {report.world_size} ranks were stopped and nothing is left running."
        + (f"\nWhere the unfinished ranks were:\n{where}" if where else "")
        + f"\nLogs of every rank: {report.log_dir}"
    )


def _where_ranks_were(report: LaunchReport, engine) -> str:
    """Each unfinished rank's line and collective, from its stack (``rank_stacks``), asked before it is stopped;
    '' on engines whose ranks are not this kernel's children (Ray, torch's elastic launcher)."""
    finished = {r.rank for r in report.ranks if r.state.is_final}
    targets = [(rank, pid, None) for rank, pid, ended in engine.rank_processes() if ended is None]
    targets = [t for t in targets if t[0] not in finished]
    if not targets:
        return ""
    answer = rank_stacks.StackRequest.send(report.log_dir, targets).collect(label=rank_stacks.kernel_label)
    return "\n".join("  " + line for line in rank_stacks.describe(answer).splitlines())
