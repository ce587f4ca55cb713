"""Launches across machines, through torch's elastic launcher (the engine behind ``torchrun``).

nblaunch runs no rendezvous of its own across machines: every machine's kernel makes the
same call, and ``torch.distributed.launcher.api.elastic_launch`` joins them through the
c10d (or static) rendezvous at ``main_process_ip:main_process_port``, starts this machine's
workers and watches them. What nblaunch adds around it is what the cell shows:

- each worker runs the one rank life cycle (``worker.lifecycle.run_rank``) through
  ``_elastic_entry``: the config's environment, the worker context for ``progress()`` (tqdm
  text bars: these workers have no event pipe to the kernel), the default process group, and
  the result pickled with every tensor on CPU; its events go to files in the run folder;
- the machine's first rank's output goes to the cell (torch tees it), every rank's to
  ``<log_dir>/…/attempt_N/<local_rank>/stdout.log``;
- the recorder turns torch's failures and the error files into the ``WorkerError`` naming the
  root-cause rank with its traceback and the tail of its output; Ctrl-C stops this machine's
  workers and raises KeyboardInterrupt.

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

from ..errors import LaunchError
from ..launch import warmup
from ..launch.report import ExitStatus
from ..worker.lifecycle import RankSpec, run_rank
from ..worker.streams import flush_all, forget_kernel_shell, fresh_std_streams

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


class _FileEvents:
    """The events of a rank under torch's launcher: no pipe to the kernel, so an error goes to a file in
    the run folder (read after the run) and the result is kept for the entry to return to torch."""

    def __init__(self, error_dir: str, rank: int):
        self.path = os.path.join(error_dir, f"rank{rank}.error")
        self.result: bytes | None = None

    def send(self, kind, payload=None) -> None:
        if kind == "error":
            with open(self.path, "wb") as fh:
                pickle.dump(payload, fh)

    def send_result(self, body: bytes) -> None:
        self.result = body


def _elastic_entry(blob, base: dict, error_dir: str):
    """What every worker runs under ``elastic_launch``; returns the pickled result (or None)."""
    env = base["env"]
    os.environ.update(env)
    rank = int(os.environ["RANK"])
    try:
        if base["stdio_from_kernel"]:
            fresh_std_streams()  # fork: the kernel's stream objects would write to its ZMQ sockets
            forget_kernel_shell()
        work = cloudpickle.loads(blob) if isinstance(blob, bytes) else blob
        local_rank = int(os.environ["LOCAL_RANK"])
        import torch

        device = "cpu"
        cpu_asked = env.get("ACCELERATE_USE_CPU", "").lower() == "true"  # accelerate launch writes "True"
        if base["backend"] == "nccl" or (torch.cuda.is_available() and not cpu_asked):
            device = f"cuda:{local_rank % max(1, torch.cuda.device_count())}"
        spec = RankSpec(
            rank=rank,
            local_rank=local_rank,
            world_size=int(os.environ["WORLD_SIZE"]),
            backend=base["backend"],
            device=device,
            env=env,
            return_result=True,
            progress_render=base["render"],
            progress_scope=base["scope"],
            metrics=base["metrics"],
        )
        events = _FileEvents(error_dir, rank)
        end = run_rank(spec, work, events)
        if end.error is not None:
            raise end.error
        if end.code:
            raise SystemExit(end.code)
        return events.result
    finally:
        flush_all()


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


def rendezvous_endpoint(plan) -> str:
    return f"{plan.main_process_ip}:{plan.rdzv_port}"


class ElasticEngine:
    """This machine's share of ranks through ``torch.distributed.launcher.api.elastic_launch``."""

    clock = "monotonic"  # the error files of this machine's ranks are read here, on this machine's clock
    routes_output = False  # torch tees the shown ranks' output and writes every rank's log itself
    stop_grace_s = 0.0  # torch's agent stops its workers itself before elastic_launch returns

    def __init__(self, req, plan, log_dir: str, out, err, *, render: str, spawn_blob: bytes | None = None):
        from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std

        self.req, self.plan, self.log_dir = req, plan, log_dir
        self.render = "text" if render == "widgets" else render  # no event pipe: tqdm text bars
        self.n = plan.processes_per_machine
        self.first_rank = plan.machine_rank * self.n
        self.error_dir = os.path.join(log_dir, "errors")
        shown = range(self.n) if plan.output == "all" else (0,) if plan.output == "rank0" else ()
        self.logs = DefaultLogsSpecs(
            log_dir=log_dir,
            redirects={r: Std.ALL for r in range(self.n)},
            tee={r: Std.ALL for r in shown},
        )
        self._tails = _LogTails(self.logs.root_log_dir, self.first_rank)
        self.port = plan.rdzv_port
        self.t_call = time.monotonic()
        self.peer_hint = (
            f"This machine (machine_rank {plan.machine_rank}) runs ranks {self.first_rank}.."
            f"{self.first_rank + self.n - 1}; a rank on another machine may have failed first: see the output on "
            "that machine."
        )
        self.values = None

    def tail(self, rank: int, n: int = 20) -> str:
        return self._tails.tail(rank, n)

    def prepare(self) -> None:
        os.makedirs(self.error_dir, exist_ok=True)
        if self.plan.start_method == "fork":
            warmup.ensure()

    def start(self, recorder) -> None:
        pass  # elastic_launch starts and watches the workers in wait()

    def stop(self) -> None:
        pass  # by the time the recorder hears of a failure, torch's agent has stopped every worker

    def _config(self):
        from torch.distributed.launcher.api import LaunchConfig

        plan, req = self.plan, self.req
        rdzv_configs = dict(req.elastic.get("rdzv_conf") or {})
        if plan.rdzv_backend == "static":
            rdzv_configs.setdefault("rank", plan.machine_rank)
        return LaunchConfig(
            min_nodes=plan.num_machines,
            max_nodes=plan.num_machines,
            nproc_per_node=self.n,
            logs_specs=self.logs,
            run_id=req.elastic.get("rdzv_id") or "none",
            rdzv_endpoint=rendezvous_endpoint(plan),
            rdzv_backend=plan.rdzv_backend,
            rdzv_configs=rdzv_configs,
            max_restarts=req.elastic.get("max_restarts", 0),
            monitor_interval=req.elastic.get("monitor_interval") or 0.1,
            start_method=plan.start_method,
            log_line_prefix_template=req.line_prefix or "[rank ${rank}] ",
        )

    def wait(self, recorder) -> None:
        from torch.distributed.elastic.multiprocessing.api import SignalException
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.launcher.api import elastic_launch

        plan, req = self.plan, self.req
        base = {
            "env": dict(plan.base_env),
            "stdio_from_kernel": plan.start_method == "fork",
            "backend": plan.backend,
            "render": self.render,
            "scope": plan.progress,
            "metrics": plan.metrics,
        }
        # fork: the workers inherit the function (a cell's whole namespace, say); spawn: it travels by cloudpickle.
        work = (req.fn, req.args, req.kwargs)
        blob = cloudpickle.dumps(work) if plan.start_method == "spawn" else work
        handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)}
        # torch's agent logs every worker failure with its stack; the WorkerError says it once, readably.
        agent_log = logging.getLogger("torch.distributed.elastic")
        agent_level = agent_log.level
        agent_log.setLevel(logging.CRITICAL)
        _launching[0] = True
        try:
            values = elastic_launch(self._config(), _elastic_entry)(blob, base, self.error_dir)
        except SignalException as e:
            if e.sigval == signal.SIGINT:
                raise KeyboardInterrupt from None
            recorder.interrupted()
            raise LaunchError(
                f"nblaunch: the launch was stopped by {e.sigval.name}; every local worker was stopped."
            ) from None
        except ChildFailedError as e:
            self._record_failures(e, recorder)
            return
        finally:
            _launching[0] = False
            agent_log.setLevel(agent_level)
            for s, h in handlers.items():
                signal.signal(s, h)
        # rank 0's value on machine 0; elsewhere that machine's first rank's (its cell's result and --return names)
        for i, r in enumerate(sorted(values)):
            recorder.event(i, "result", values[r])

    def _record_failures(self, e, recorder) -> None:
        # torch lists the failures it saw first; a rank that raised a moment later left its error file too.
        recorded = {int(os.path.basename(p)[4:-6]) for p in glob.glob(os.path.join(self.error_dir, "rank*.error"))}
        for rank in sorted(set(e.failures) | recorded):
            path = os.path.join(self.error_dir, f"rank{rank}.error")
            if os.path.exists(path):
                with open(path, "rb") as fh:
                    recorder.event(rank, "error", pickle.load(fh))
            else:
                pf = e.failures[rank]
                status = ExitStatus(None, -pf.exitcode) if pf.exitcode < 0 else ExitStatus(pf.exitcode, None)
                recorder.exited(rank, status)

    def close(self, grace: float, recorder) -> None:
        pass  # elastic_launch has returned: its agent has stopped and reaped every worker
