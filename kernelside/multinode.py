"""Launches across machines, through torch's elastic launcher (the engine behind ``torchrun``).

nblaunch runs no rendezvous of its own across machines: every machine's kernel makes the
same call, and ``torch.distributed.launcher.api.elastic_launch`` joins them through the
c10d (or static) rendezvous at ``main_process_ip:main_process_port``, starts this machine's
workers and watches them. What nblaunch adds around it is what the cell shows:

- each worker runs the function through ``_elastic_entry``: the config's environment,
  ``rank`` / ``world_size`` for ``progress()`` (tqdm text bars on rank 0), the default
  process group, and the result pickled with every tensor on CPU;
- the machine's first rank's output goes to the cell (torch tees it), every rank's to
  ``<log_dir>/…/attempt_N/<local_rank>/stdout.log``;
- a failure becomes a ``WorkerError`` naming the root-cause rank with its traceback and
  the tail of its output; Ctrl-C stops this machine's workers and raises KeyboardInterrupt.

Example (the same call on every machine, ``node_rank`` 0 and 1)::

    >>> notebook_launcher(train, num_processes=2, num_nodes=2, node_rank=0,
    ...                   rdzv_backend="c10d", rdzv_endpoint="10.0.0.1:29500")   # doctest: +SKIP
"""

from __future__ import annotations

import glob
import io
import logging
import os
import pickle
import signal
import sys
import time

import cloudpickle

from .errors import LaunchError, WorkerError
from .plan import LaunchPlan
from .progress import RENDER_ENV, SCOPE_ENV
from .report import Failure, LaunchReport, format_failure_message

_launching = [False]


def _fd_streams_in_forked_worker() -> None:
    """In a worker forked while torch's launcher starts it: sys.stdout/err on fds 1/2.

    torch redirects a worker's output by ``dup2`` onto ``sys.stdout.fileno()``; in a Jupyter kernel
    that is ipykernel's stream object, whose fileno() is not fd 1, so the redirect would miss.
    """
    if _launching[0]:
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", line_buffering=True)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8", line_buffering=True)


os.register_at_fork(after_in_child=_fd_streams_in_forked_worker)


class _NoEvents:
    """Workers under torch's launcher have no event pipe to the kernel: progress draws text bars."""

    def send(self, kind, payload=None) -> None:
        pass

    def send_result(self, body) -> None:
        pass


def _elastic_entry(blob, env: dict, error_dir: str, backend: str, want_result: bool):
    """What every worker runs under ``elastic_launch``; returns the pickled result (or None)."""
    from . import worker
    from .progress import finish_in_worker

    os.environ.update(env)
    rank = int(os.environ["RANK"])
    try:
        if env.get("NBLAUNCH_STDIO_FROM_KERNEL") == "1":
            worker._fresh_std_streams()  # fork: the kernel's stream objects would write to its ZMQ sockets
            worker._forget_kernel_shell()
        fn, args, kwargs = cloudpickle.loads(blob) if isinstance(blob, bytes) else blob
        local_rank = int(os.environ["LOCAL_RANK"])
        world_size = int(os.environ["WORLD_SIZE"])
        import torch

        device = "cpu"
        if backend == "nccl" or (torch.cuda.is_available() and os.environ.get("ACCELERATE_USE_CPU") != "true"):
            device = f"cuda:{local_rank % max(1, torch.cuda.device_count())}"
        worker.CURRENT = worker.WorkerContext(rank, local_rank, world_size, device, _NoEvents())
        payload = worker.Payload(fn, args, kwargs, rank, world_size, backend, device, env, os.getppid(), -1, False)
        worker._set_threads()
        worker._init_process_group(payload)
        worker._patch_init_process_group([getattr(fn, "__globals__", {})])
        value = fn(*args, **kwargs)
        finish_in_worker()
        return worker.dumps_result(worker.unwrap_for_return(value)) if want_result else None
    except BaseException as e:
        with open(os.path.join(error_dir, f"rank{rank}.error"), "wb") as fh:
            pickle.dump(worker._error_payload(e, "run"), fh)
        raise
    finally:
        worker._flush_all()


class _LogTails:
    """``tail(rank)`` for the failure message, read from torch's per-rank log files."""

    def __init__(self, log_dir: str, first_rank: int):
        self.log_dir, self.first_rank = log_dir, first_rank

    def paths(self, rank: int) -> list[str]:
        local = rank - self.first_rank
        return sorted(glob.glob(os.path.join(self.log_dir, "*", "attempt_*", str(local), "std*.log")))

    def tail(self, rank: int, n: int = 20) -> str:
        lines = []
        for path in self.paths(rank):
            with open(path, errors="replace") as fh:
                lines += fh.readlines()[-n:]
        return "".join(lines[-n:])


def rendezvous_endpoint(plan: LaunchPlan) -> str:
    return f"{plan.main_process_ip}:{plan.rdzv_port}"


def launch_elastic(req, plan: LaunchPlan, log_dir: str, out, err):
    """Run ``req.fn`` on this machine's share of ranks; the other machines make the same call."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from .engine import LaunchOutcome, _state

    n = plan.num_processes  # on this machine
    first_rank = plan.machine_rank * n
    report = LaunchReport(
        world_size=n * plan.num_machines,
        backend=plan.backend,
        start_method=plan.start_method,
        port=plan.rdzv_port,
        log_dir=log_dir,
        started_at=time.time(),
    )
    _state["last_report"] = report
    error_dir = os.path.join(log_dir, "errors")
    os.makedirs(error_dir, exist_ok=True)
    shown = range(n) if plan.output == "all" else (0,) if plan.output == "rank0" else ()
    logs = DefaultLogsSpecs(
        log_dir=log_dir,
        redirects={r: Std.ALL for r in range(n)},
        tee={r: Std.ALL for r in shown},
    )
    rdzv_configs = dict(req.elastic.get("rdzv_conf") or {})
    if plan.rdzv_backend == "static":
        rdzv_configs.setdefault("rank", plan.machine_rank)
    config = LaunchConfig(
        min_nodes=plan.num_machines,
        max_nodes=plan.num_machines,
        nproc_per_node=n,
        logs_specs=logs,
        run_id=req.elastic.get("rdzv_id") or "none",
        rdzv_endpoint=rendezvous_endpoint(plan),
        rdzv_backend=plan.rdzv_backend,
        rdzv_configs=rdzv_configs,
        max_restarts=req.elastic.get("max_restarts", 0),
        monitor_interval=req.elastic.get("monitor_interval") or 0.1,
        start_method=plan.start_method,
        log_line_prefix_template=req.line_prefix or "[rank ${rank}] ",
    )
    env = {**plan.base_env, RENDER_ENV: "text" if plan.output != "none" else "off", SCOPE_ENV: plan.progress}
    env["NBLAUNCH_STDIO_FROM_KERNEL"] = "1" if plan.start_method == "fork" else "0"
    # fork: the workers inherit the function (a cell's whole namespace, say); spawn: it travels by cloudpickle.
    work = (req.fn, req.args, req.kwargs)
    blob = cloudpickle.dumps(work) if plan.start_method == "spawn" else work
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)}
    # torch's agent logs every worker failure with its stack; the WorkerError below says it once, readably.
    agent_log = logging.getLogger("torch.distributed.elastic")
    agent_level = agent_log.level
    agent_log.setLevel(logging.CRITICAL)
    t0 = time.monotonic()
    _launching[0] = True
    try:
        values = elastic_launch(config, _elastic_entry)(blob, env, error_dir, plan.backend, True)
    except SignalException as e:
        report.outcome = "interrupted"
        if e.sigval == signal.SIGINT:
            raise KeyboardInterrupt from None
        raise LaunchError(
            f"nblaunch: the launch was stopped by {e.sigval.name}; every local worker was stopped."
        ) from None
    except ChildFailedError as e:
        report.outcome = "failed"
        report.failures = _failures(e, error_dir)
        root = report.root_cause()
        message = format_failure_message(report, root, _LogTails(logs.root_log_dir, first_rank))
        if root.caused_by_peer:
            message += (
                f"\nThis machine (machine_rank {plan.machine_rank}) runs ranks {first_rank}..{first_rank + n - 1}; "
                "a rank on another machine may have failed first: see the output on that machine."
            )
        raise WorkerError(message, rank=root.rank, failures=report.failures, report=report) from None
    finally:
        _launching[0] = False
        agent_log.setLevel(agent_level)
        for s, h in handlers.items():
            signal.signal(s, h)
        report.wall_s = time.monotonic() - t0
        report.ended_at = time.time()
    report.outcome = "ok"
    ordered = [cloudpickle.loads(values[r]) for r in sorted(values)]
    # rank 0's value on machine 0; elsewhere that machine's first rank's (its cell's result and --return names)
    return LaunchOutcome(ordered[0], ordered if req.return_all else None, report)


def _failures(e, error_dir: str) -> list[Failure]:
    out = []
    # torch lists the failures it saw first; a rank that raised a moment later left its error file too.
    recorded = {int(os.path.basename(p)[4:-6]) for p in glob.glob(os.path.join(error_dir, "rank*.error"))}
    for rank in sorted(set(e.failures) | recorded):
        pf = e.failures.get(rank)
        path = os.path.join(error_dir, f"rank{rank}.error")
        if os.path.exists(path):
            with open(path, "rb") as fh:
                p = pickle.load(fh)
            out.append(Failure.from_error(rank, p))
        else:
            how = f"killed by {pf.signal_name()}" if pf.exitcode < 0 else f"exit code {pf.exitcode}"
            out.append(Failure(rank=rank, kind="exit", message=how, t=time.monotonic()))
    return out
