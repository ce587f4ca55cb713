"""The one life cycle of a rank, whichever engine started it (local fork/spawn, torch's elastic
launcher, Ray Train).

``run_rank()`` does, in order: apply the environment contract, set the worker context, the
thread count, initialize the default process group (unless the engine provides one), make
``init_process_group()`` and ``destroy_process_group()`` of the default group in user code
no-ops (``group_owner``), install the event-sending progress bars, send
``ready``, run the function, send ``done`` and the result (tensors on CPU), or the error
(type, message, traceback without nblaunch's frames). It returns how the rank ended; the
caller (the engine's worker entry) decides how the process leaves.

Example::

    >>> spec = RankSpec(rank=0, local_rank=0, world_size=1, backend="gloo", device="cpu")   # doctest: +SKIP
    >>> run_rank(spec, (train, (0.1,), {}), events).code
    0
"""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
import traceback

from ..short_traceback import is_nblaunch_file
from . import (
    accelerate_ranks,
    context,
    gather_agreement,
    group_owner,
    lightning_bars,
    live_rescue,
    metric_capture,
    output_positions,
    progress,
    rank_debugger,
    rank_departure,
    rank_display,
    rank_identity,
    rank_stdin,
    sharded_results,
    stack_answer,
)
from .context import stamp
from .results import dumps_result, unwrap_for_return


@dataclasses.dataclass
class RankSpec:
    """What a rank must know before user code runs. Plain data: it travels to spawned ranks as JSON."""

    rank: int
    local_rank: int
    world_size: int
    backend: str
    device: str
    env: dict = dataclasses.field(default_factory=dict)
    return_result: bool = False
    progress_render: str = "text"
    progress_scope: str = "rank0"
    metrics: str = "on"  # "on": the frameworks' loggers feed log_metrics() (metric_capture.py)
    init_process_group: bool = True  # False where the engine (Ray Train) sets the process group up
    # the engine ends the process with os._exit (local): user code's destroy_process_group() of the
    # default group is then a no-op, as nothing at the rank's end runs the group's destructor (group_owner.py)
    leaves_with_exit: bool = False
    stacks_file: str = ""  # where this rank dumps its stacks when asked (worker/stack_answer.py); "" for none
    result_segments: str = ""  # the launch's shared-memory folder for big return values (result_segments.py)
    debugger: str = ""  # the kernel's address for this rank's debugger (JupyterLab's panel on); "" for none
    group_gen: int = 0  # a lost rank's replacement: it joins its peers' default group rebuilt in place as this one
    gather_relay: bool = False  # the kernel holds the store and records a rank with nothing sharded (gather_agreement)

    @classmethod
    def build(
        cls,
        launch: dict,
        *,
        rank: int,
        local_rank: int,
        world_size: int,
        device: str,
        env: dict,
        init_process_group: bool = True,
        leaves_with_exit: bool = False,
        stacks_file: str = "",
        result_segments: str = "",
        group_gen: int = 0,
        gather_relay: bool = False,
    ) -> RankSpec:
        """The one place a rank's spec is made: the launch-wide settings (``engines.contract.launch_settings``,
        plain data that travels to any engine's workers) plus who this rank is.

        Example::

            >>> launch = {"backend": "gloo", "render": "text", "scope": "rank0", "metrics": "on", "return_all": False}
            >>> RankSpec.build(launch, rank=1, local_rank=1, world_size=2, device="cpu", env={}).return_result
            False
        """
        return cls(
            rank=rank,
            local_rank=local_rank,
            world_size=world_size,
            backend=launch["backend"],
            device=device,
            env=env,
            return_result=rank == 0 or launch["return_all"],
            progress_render=launch["render"],
            progress_scope=launch["scope"],
            metrics=launch["metrics"],
            init_process_group=init_process_group,
            leaves_with_exit=leaves_with_exit,
            stacks_file=stacks_file,
            result_segments=result_segments,
            debugger=launch.get("debugger", ""),
            group_gen=group_gen,
            gather_relay=gather_relay,
        )


@dataclasses.dataclass
class RankEnd:
    """How ``run_rank`` ended: the exit code the process should leave with, and the exception if any."""

    code: int
    error: BaseException | None = None


def error_payload(exc: BaseException, phase: str) -> dict:
    """An ``error`` event: what the kernel needs to name the root cause (both clocks, see RunRecorder)."""
    return {
        "type": type(exc).__name__,
        "module": type(exc).__module__,
        "message": str(exc),
        "traceback": _user_traceback(exc),
        "phase": phase,
        "t": time.monotonic(),
        "wall": time.time(),
    }


def _user_traceback(exc: BaseException) -> str:
    """The formatted traceback without nblaunch's own frames at the top."""
    tb = exc.__traceback__
    while tb is not None and is_nblaunch_file(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb or exc.__traceback__))


def _set_threads() -> None:
    n = os.environ.get("OMP_NUM_THREADS")
    if n and n.isdigit():
        import torch

        torch.set_num_threads(int(n))


def _init_process_group(spec: RankSpec) -> None:
    import torch
    import torch.distributed as dist

    if spec.device.startswith("cuda"):
        torch.cuda.set_device(torch.device(spec.device))
    if spec.group_gen:  # its peers make this group in live_rescue.rebuild_group, which meets no further on gloo
        live_rescue.join_rebuilt_group(spec.group_gen, spec.backend, spec.rank, spec.world_size)
    else:
        dist.init_process_group(
            backend=spec.backend,
            init_method="env://",
            rank=spec.rank,
            world_size=spec.world_size,
            timeout=group_owner.GROUP_TIMEOUT,
        )
    # gloo can return from init on one rank while a peer is still completing its connections;
    # a rank whose code then ends at once would close them under the peer. Meet once first.
    if spec.backend == "nccl":
        dist.barrier(device_ids=[torch.cuda.current_device()])  # names the device: no NCCL guesswork
    elif not spec.group_gen:
        dist.barrier()


def run_rank(spec: RankSpec, work, events, replies_fd: int = -1) -> RankEnd:
    """Run ``work`` = (fn, args, kwargs) as rank ``spec.rank``; every outcome is also sent as an event.

    ``replies_fd``: the kernel → rank pipe of an engine that relays rank 0's display() and input()
    to the notebook (the local engine); -1 where the engine does not.
    """
    fn, args, kwargs = work
    failed = start_rank(spec, events, [getattr(fn, "__globals__", {})], replies_fd)
    if failed is not None:
        return failed
    events.send("ready", {**stamp(), "pid": os.getpid()})
    return run_work(spec, fn, args, kwargs, events)


def start_rank(spec: RankSpec, events, namespaces=(), replies_fd: int = -1) -> RankEnd | None:
    """Set the rank up once (environment, context, process group, progress bars); a RankEnd if that failed.

    A live rank (``worker.live_rank``) calls this once and then ``run_work`` for every cell.
    """
    import sys

    phase = "startup"
    try:
        stack_answer.install(spec.stacks_file)  # first: a rank stuck in its start-up can be asked where it is
        os.environ.update(spec.env)
        if threading.current_thread() is threading.main_thread():  # (Ray Train runs ranks in a thread)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        _set_threads()
        context.set_current(
            context.WorkerContext(
                spec.rank,
                spec.local_rank,
                spec.world_size,
                spec.device,
                events,
                progress_render=spec.progress_render,
                progress_scope=spec.progress_scope,
            )
        )
        rank_identity.become_launched_worker(spec.rank)  # no interactive markers, clean Accelerate state
        if replies_fd >= 0:  # the local engine: a kernel loop reads this rank's pipes, in order
            output_positions.marks_are_read(events)
            rank_display.install(events, spec.rank)  # rank 0's display() / plt.show() reach the cell
            rank_stdin.install(events, replies_fd, spec.rank)  # rank 0's input() / pdb answered in the cell
        if spec.init_process_group:
            phase = "init_process_group"
            _init_process_group(spec)
        main = sys.modules.get("__main__")
        own_destroy = spec.leaves_with_exit and spec.init_process_group
        group_owner.take_over(list(namespaces) + ([vars(main)] if main is not None else []), own_destroy)
        rank_debugger.install_distributed_breakpoint()  # torch's reads /dev/stdin: any rank, from the cell
        progress.install_in_worker()
        lightning_bars.install_in_worker()
        metric_capture.install_in_worker(spec.metrics == "on")
        accelerate_ranks.install_in_worker(spec.device)
        if spec.debugger:  # last: the kernel configures this rank's debugger, then user code runs
            from ..debugger import rank_side

            rank_side.connect(spec.debugger, spec.rank)
        return None
    except BaseException as e:  # noqa: B036 - every failure must reach the kernel
        _report(events, e, phase)
        return RankEnd(1, e)


def run_work(spec: RankSpec, fn, args, kwargs, events, run: str = gather_agreement.RUN) -> RankEnd:
    """Run one piece of user code on a set-up rank: ``done`` and the result, or the error, as events. ``run``: the
    same on every rank of this run (a live cell's request id), for the agreement on sharded values."""
    phase = "run"
    keep = spec.return_result
    try:
        value = unwrap_for_return(fn(*args, **kwargs))
        progress.finish_in_worker()
        phase = "result gather"  # every rank: sharded values (FSDP, DTensor) are gathered together
        found = None
        try:
            found = sharded_results.find_gathers(value)  # (a value that cannot be gathered raises: after ``done``)
        finally:
            sharded = found is not None and bool(found.gathers)
            relayed = gather_agreement.done_fields(sharded, keep) if spec.gather_relay else {}
            events.send("done", {**stamp(), **relayed})
        value = sharded_results.gather_for_return(value, keep=keep, run=run, relay=spec.gather_relay, found=found)
        phase = "result"
        if spec.return_result:
            events.send_result(dumps_result(value, spec.result_segments, spec.rank))
        return RankEnd(0)
    except SystemExit as e:  # sys.exit(0) in user code is a normal end, like a script's
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if code != 0:
            _report(events, e, phase)
        elif phase == "run":
            rank_departure.announce(events, e)  # peers still in a collective will blame this
        if phase == "run":
            sharded_results.leave(run, spec.gather_relay)  # no peer waits for this rank's part of a gather
        return RankEnd(code, e if code else None)
    except BaseException as e:  # noqa: B036 - every failure must reach the kernel
        if phase == "result":
            e = RuntimeError(
                f"rank {spec.rank}'s return value could not be sent back: {type(e).__name__}: {e}. "
                "Return plain data (numbers, lists, dicts, tensors, state_dict()) instead."
            )
        _report(events, e, phase)
        return RankEnd(1, e)


def _report(events, e: BaseException, phase: str) -> None:
    try:
        events.send("error", error_payload(e, phase))
    except Exception:
        traceback.print_exc()
