"""The one launch engine behind ``notebook_launcher()`` and ``%%distributed``.

``launch(request)`` resolves the plan, starts the workers, and runs a single loop in the
calling thread that multiplexes every rank's stdout/stderr/event pipes and exit
notifications. The first failure (an error event, a non-zero exit, a timeout, Ctrl-C)
stops every other rank at once — ranks blocked in a collective included — and the call
returns promptly with a ``WorkerError`` naming the root cause.

Example::

    >>> out = launch(LaunchRequest(fn=train, args=(0.1,), arguments={"num_processes": 2}))  # doctest: +SKIP
    >>> out.value, out.report.startup_s
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import fcntl
import os
import shutil
import socket
import sys
import tempfile
import threading
import time

import cloudpickle

from . import cuda_guard, hardware
from .config import resolve_config
from .errors import LaunchConfigError, LaunchError, LaunchStoppedError, LaunchTimeoutError, WorkerError
from .event_loop import TERMINATE_GRACE_S, EventLoop
from .group import WorkerGroup
from .output import RankOutputRouter
from .plan import LaunchPlan, make_plan
from .progress import RENDER_ENV, SCOPE_ENV
from .progress_view import make_run_display, render_mode
from .report import LaunchReport, RankReport, format_failure_message
from .run_tracker import track_run
from .worker import Payload

INTERRUPT_GRACE_S = 1.0
_launch_lock = threading.Lock()
_state = {"last_report": None, "warmed": False}


@dataclasses.dataclass
class LaunchRequest:
    """What to run and how. ``arguments`` holds only explicitly given config keys."""

    fn: object
    args: tuple = ()
    kwargs: dict = dataclasses.field(default_factory=dict)
    arguments: dict = dataclasses.field(default_factory=dict)
    config: str | None = None
    return_all: bool = False
    describe_args: tuple[str, ...] | None = None  # names for args in error messages
    on_event: object = None  # callable(rank, kind, payload) for progress/metrics renderers
    stdout: object = None
    stderr: object = None
    bind: object = None  # callable(plan) -> the function to run, once the plan (fork/spawn...) is known
    line_prefix: str | None = None  # torchrun-style template: "${rank}", "${local_rank}", "${role_name}"
    restart_count: int = 0
    elastic: dict = dataclasses.field(default_factory=dict)  # rdzv_conf, rdzv_id, max_restarts... (multi-machine)


@dataclasses.dataclass
class LaunchOutcome:
    value: object
    values: list | None
    report: LaunchReport


def last_report() -> LaunchReport | None:
    """The report of the most recent launch in this process (success or failure)."""
    return _state["last_report"]


def _warm_imports() -> None:
    """Pay once in the kernel what every forked worker would otherwise pay on its first DDP/collective."""
    if _state["warmed"]:
        return
    import torch.distributed  # noqa: F401
    import torch.nn.parallel  # noqa: F401

    try:
        import torch._dynamo  # noqa: F401  (imported by the first DDP construction, ~2.7 s per process)
    except Exception:
        pass
    _state["warmed"] = True


def _listen_socket(requested: int | None, out) -> socket.socket:
    """Hold the rendezvous port from now until the TCPStore takes it over: no race with another launch."""
    if requested:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", requested))
            s.listen(1024)
            return s
        except OSError:
            s.close()
            fallback = _listen_socket(None, out)
            out.write(f"nblaunch: port {requested} is in use; using free port {fallback.getsockname()[1]} instead.\n")
            return fallback
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen(1024)
    return s


KEEP_RUN_LOGS = 50  # per log folder, the newest runs' logs are kept; older run folders are removed
_IN_USE = ".in-use"  # each run holds an flock on this file while it runs: pruning never takes a live folder


@contextlib.contextmanager
def _run_log_dir(plan: LaunchPlan):
    """A fresh ``run-<time>-…`` folder for this launch's logs, locked for as long as the launch runs."""
    base = plan.log_dir or os.path.join(tempfile.gettempdir(), f"nblaunch-{os.getuid()}")
    os.makedirs(base, exist_ok=True)
    runs = sorted(e.path for e in os.scandir(base) if e.is_dir(follow_symlinks=False) and e.name.startswith("run-"))
    for old in runs[: max(0, len(runs) - KEEP_RUN_LOGS + 1)]:  # names sort by their timestamp
        if not _in_use(old):
            shutil.rmtree(old, ignore_errors=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = tempfile.mkdtemp(prefix=f"run-{stamp}-", dir=base)
    fd = os.open(os.path.join(path, _IN_USE), os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield path
    finally:
        os.close(fd)


def _in_use(run_dir: str) -> bool:
    try:
        fd = os.open(os.path.join(run_dir, _IN_USE), os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def _check_picklable(req: LaunchRequest) -> bytes:
    """Pickle the function and arguments once for spawn; an unpicklable one is named before anything starts."""
    try:
        return cloudpickle.dumps((req.fn, req.args, req.kwargs), protocol=5)
    except Exception as e:
        parts = [("the function", req.fn)]
        names = req.describe_args or tuple(f"args[{i}]" for i in range(len(req.args)))
        parts += list(zip(names, req.args, strict=True)) + [(f"kwargs[{k!r}]", v) for k, v in req.kwargs.items()]
        for name, obj in parts:
            try:
                cloudpickle.dumps(obj)
            except Exception as inner:
                raise LaunchConfigError(
                    name,
                    obj,
                    None,
                    message=f"{name} ({type(obj).__name__}) cannot be sent to spawned workers: "
                    f"{type(inner).__name__}: {inner}. Use start_method='fork' (possible while CUDA is not "
                    "initialized in the kernel), or create that object inside the launched function. "
                    "Nothing was started.",
                ) from None
        raise LaunchConfigError(None, None, None, message=f"cannot pickle the launch for spawn: {e}") from None


def launch(req: LaunchRequest) -> LaunchOutcome:
    """Run ``req.fn`` on every rank; return rank 0's value (and all values with ``return_all``)."""
    if not callable(req.fn):
        raise LaunchConfigError("function", req.fn, "a callable (a function defined in the notebook, say)")
    out = req.stdout or sys.stdout
    err = req.stderr or sys.stderr
    cfg = resolve_config(req.arguments, config=req.config)
    for w in cfg.warnings:
        err.write(f"nblaunch: {w}\n")
    plan = make_plan(
        cfg,
        gpus=hardware.gpu_count(),
        cuda_initialized=cuda_guard.is_cuda_initialized(),
        init_site=cuda_guard.first_init_site(),
    )
    if req.bind is not None:
        req.fn = req.bind(plan)
    if plan.start_method == "spawn" and plan.start_reason.startswith("nblaunch:"):
        out.write(plan.start_reason + "\n")
    blob = _check_picklable(req) if plan.start_method == "spawn" else None
    if not _launch_lock.acquire(blocking=False):
        raise LaunchError(
            "another nblaunch launch is already running in this kernel (from another thread); "
            "launches run one at a time. Wait for it to finish, then launch again."
        )
    try:
        with _run_log_dir(plan) as log_dir, track_run(log_dir, plan, last_report) as tracker:
            if plan.engine == "ray":  # Ray Train on a Ray cluster
                from .ray_engine import launch_ray

                return launch_ray(req, plan, blob, log_dir, out, err)
            if plan.num_machines > 1:  # across machines: torch's elastic launcher, not an engine of ours
                from .multinode import launch_elastic

                return launch_elastic(req, plan, log_dir, out, err)
            # handed over in a box that _run empties: the kernel holds no extra copy of the
            # pickled arguments once the workers have them
            box, blob = [blob], None
            return _run(req, plan, box, log_dir, out, err, tracker)
    finally:
        _launch_lock.release()


def _run(req: LaunchRequest, plan: LaunchPlan, blob_box: list, log_dir: str, out, err, tracker) -> LaunchOutcome:
    t_call = time.monotonic()
    if plan.start_method == "fork":
        _warm_imports()
    sock = _listen_socket(plan.requested_port, out)
    port = sock.getsockname()[1]
    report = LaunchReport(
        world_size=plan.num_processes,
        backend=plan.backend,
        start_method=plan.start_method,
        port=port,
        log_dir=log_dir,
        started_at=time.time(),
    )
    _state["last_report"] = report
    render = render_mode(plan.output)
    extra_env = {"TORCHELASTIC_RESTART_COUNT": str(req.restart_count), RENDER_ENV: render, SCOPE_ENV: plan.progress}
    payloads = [
        Payload(
            fn=req.fn,
            args=req.args,
            kwargs=req.kwargs,
            rank=r,
            world_size=plan.num_processes,
            backend=plan.backend,
            device=plan.device_for(r),
            env={**plan.env_for(r, port), **extra_env},
            parent_pid=os.getpid(),
            events_fd=-1,
            return_result=(r == 0 or req.return_all),
        )
        for r in range(plan.num_processes)
    ]
    router = RankOutputRouter(plan.num_processes, plan.output, log_dir, out, err, prefix_template=req.line_prefix)
    display = make_run_display(report, plan.output, plan.progress) if render == "widgets" else None
    group = store = loop = None
    try:
        group = WorkerGroup.start(payloads, plan.start_method, spawn_blob=blob_box.pop(), keep_fds=(sock.fileno(),))
        report.ranks = [RankReport(rank=w.rank, pid=w.pid, log_path=router.log_paths[w.rank]) for w in group.workers]
        store = _start_store(sock, port, plan.num_processes)
        sock = None
        if display is not None:
            display.show()
        loop = EventLoop(group, router, report, req, plan, t_call, display, tracker)
        loop.run()
    except KeyboardInterrupt as e:
        report.outcome = "interrupted"
        if display is not None:
            display.finish(e)
        raise
    finally:
        if sock is not None:
            sock.close()
        if group is not None:
            # stopped from the panel: the loop gave the ranks their grace already
            group.close(grace={"interrupted": INTERRUPT_GRACE_S, "stopped": 0}.get(report.outcome, TERMINATE_GRACE_S))
            for rr, w in zip(report.ranks, group.workers, strict=True):
                rr.status = w.status
        router.finish()
        del store  # stops the TCPStore server and frees the port
        report.ended_at = time.time()
        report.wall_s = time.monotonic() - t_call
    try:
        outcome = _outcome(report, loop, req, router)
    except WorkerError as e:
        if display is not None:
            display.finish(e)
        raise
    if display is not None:
        display.finish(None)
    return outcome


def _start_store(sock: socket.socket, port: int, world_size: int):
    from torch.distributed import TCPStore

    fd = sock.detach()  # the TCPStore owns the listening socket from here on
    return TCPStore(
        "127.0.0.1",
        port,
        world_size,
        True,
        datetime.timedelta(seconds=300),
        wait_for_workers=False,
        master_listen_fd=fd,
    )


def _outcome(report: LaunchReport, loop: EventLoop, req: LaunchRequest, router) -> LaunchOutcome:
    if report.failures:
        root = report.root_cause()
        message = format_failure_message(report, root, router)
        cls = {"timeout": LaunchTimeoutError, "stopped": LaunchStoppedError}.get(report.outcome, WorkerError)
        raise cls(message, rank=root.rank, failures=report.failures, report=report)
    values = []
    for rank, body in enumerate(loop.results):
        try:
            values.append(cloudpickle.loads(body) if body is not None else None)
        except Exception as e:
            report.outcome = "failed"
            raise WorkerError(
                f"nblaunch: rank {rank}'s return value arrived but cannot be rebuilt in the kernel: "
                f"{type(e).__name__}: {e}. Return plain data (numbers, lists, dicts, tensors, state_dict()), or "
                "objects whose classes the kernel can import.",
                rank=rank,
                failures=[],
                report=report,
            ) from None
    report.outcome = "ok"
    return LaunchOutcome(values[0], values if req.return_all else None, report)
