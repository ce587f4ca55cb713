"""Launches across machines, through torch's elastic launcher (the engine behind ``torchrun``).

nblaunch runs no rendezvous of its own across machines: every machine's kernel makes the
same call, and ``torch.distributed.launcher.api.elastic_launch`` joins them through the
c10d (or static) rendezvous at ``main_process_ip:main_process_port``, starts this machine's
workers and watches them. What nblaunch adds around it is what the cell shows:

- each worker runs the one rank life cycle (``worker.lifecycle.run_rank``) through
  ``_elastic_entry``: the config's environment, the worker context for ``progress()``, the default
  process group, and the result pickled with every tensor on CPU; its events travel through the
  rendezvous store to machine 0's cell (``engines.elastic_events``), its error to a file here;
- the machine's first rank's output goes to the cell (torch tees it), every rank's to
  ``<log_dir>/…/attempt_N/<local_rank>/stdout.log``;
- ``elastic_launch`` runs in a thread of the kernel, so ``run_engine`` keeps the policy: the
  deadline (``timeout``), Ctrl-C and the first failure stop this machine's workers (SIGTERM to the
  pids they wrote into the run folder; torch's agent then ends the rest and returns);
- the recorder turns torch's failures and the error files into the ``WorkerError`` naming the
  root-cause rank with its traceback and the tail of its output.

Example (the same call on every machine, ``node_rank`` 0 and 1)::

    >>> notebook_launcher(train, num_processes=2, num_nodes=2, node_rank=0,
    ...                   rdzv_backend="c10d", rdzv_endpoint="10.0.0.1:29500")   # doctest: +SKIP
"""

from __future__ import annotations

import glob
import io
import logging
import os
import signal
import sys
import threading

import cloudpickle

from ..debugger.undebugged import ranks_start_undebugged, undebugged
from ..errors import LaunchError
from ..worker.lifecycle import RankSpec, run_rank
from ..worker.std_streams import flush_all, forget_kernel_shell, fresh_std_streams
from . import elastic_files, warmup
from .contract import Engine, ExitStatus, launch_settings
from .elastic_events import KernelEvents, RankEvents

STOP_GRACE_S = 2.0  # after SIGTERM to its workers, torch's agent notices within monitor_interval and returns
JOIN_S = 30.0  # the longest close() waits for elastic_launch to return once every worker was killed


class _ElasticLaunch:
    launching = False  # torch's launcher is starting workers now (forked from this process)


# Global on purpose: the at-fork hook below takes no arguments, and fork is process-wide.
ELASTIC_LAUNCH = _ElasticLaunch()


def _fd_streams_in_forked_worker() -> None:
    """In a worker forked while torch's launcher starts it: sys.stdout/err on fds 1/2.

    torch redirects a worker's output by ``dup2`` onto ``sys.stdout.fileno()``; in a Jupyter kernel
    that is ipykernel's stream object, whose fileno() is not fd 1, so the redirect would miss.
    """
    if ELASTIC_LAUNCH.launching:
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", line_buffering=True)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8", line_buffering=True)


os.register_at_fork(after_in_child=_fd_streams_in_forked_worker)


def _elastic_entry(blob, base: dict, error_dir: str):
    """What every worker runs under ``elastic_launch``; returns the pickled result (or None)."""
    env = base["env"]
    os.environ.update(env)
    rank = int(os.environ["RANK"])
    elastic_files.write_pid(error_dir, rank)  # the kernel stops workers by these
    try:
        if base["stdio_from_kernel"]:
            fresh_std_streams()  # fork: the kernel's stream objects would write to its ZMQ sockets
            forget_kernel_shell()
        work = cloudpickle.loads(blob) if isinstance(blob, bytes) else blob
        local_rank = int(os.environ["LOCAL_RANK"])
        import torch

        device = "cpu"
        cpu_asked = env.get("ACCELERATE_USE_CPU", "").lower() == "true"  # accelerate launch writes "True"
        if base["launch"]["backend"] == "nccl" or (torch.cuda.is_available() and not cpu_asked):
            device = f"cuda:{local_rank % max(1, torch.cuda.device_count())}"
        spec = RankSpec.build(
            base["launch"],
            rank=rank,
            local_rank=local_rank,
            world_size=int(os.environ["WORLD_SIZE"]),
            device=device,
            env=env,
        )
        events = RankEvents(error_dir, rank, base["endpoint"], base["run"])
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
            lines += elastic_files.read_log_lines(path, n)
        return "".join(lines[-n:])


def rendezvous_endpoint(plan) -> str:
    return f"{plan.main_process_ip}:{plan.rdzv_port}"


class ElasticEngine(Engine):
    """This machine's share of ranks through ``torch.distributed.launcher.api.elastic_launch``."""

    clock = "monotonic"  # the error files of this machine's ranks are read here, on this machine's clock
    stop_grace_s = STOP_GRACE_S

    def __init__(self, req, plan, log_dir: str, out, err, *, render: str, spawn_blob: bytes | None = None):
        from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std

        self.req, self.plan, self.log_dir, self.spawn_blob = req, plan, log_dir, spawn_blob
        # what this kernel draws: widgets once prepare() has reached the store that carries the ranks'
        # events to this cell (machine 0's), else the ranks' text
        self.render, self.wanted_render = "text", render
        self.n = plan.processes_per_machine
        self.first_rank = plan.machine_rank * self.n
        self.error_dir = os.path.join(log_dir, "errors")
        shown = range(self.n) if plan.output == "all" else (0,) if plan.output == "rank0" else ()
        self.logs = DefaultLogsSpecs(
            log_dir=log_dir,
            redirects={r: Std.ALL for r in range(self.n)},
            tee={r: Std.ALL for r in shown},
        )
        self.log_tails = _LogTails(self.logs.root_log_dir, self.first_rank)  # torch writes every rank's log
        self.peer_hint = (
            f"This machine (machine_rank {plan.machine_rank}) runs ranks {self.first_rank}.."
            f"{self.first_rank + self.n - 1}; a rank on another machine may have failed first: see the output on "
            "that machine."
        )
        self.events: KernelEvents | None = None
        self.thread: threading.Thread | None = None
        self.ended: dict = {}  # what elastic_launch returned ("values") or raised ("error")
        self.told = False  # the end has been given to the recorder
        self.stopping = False
        self.agent_level = None
        self.handlers: dict = {}  # the kernel's SIGTERM / SIGHUP handlers, while ours stand in

    @property
    def run_id(self) -> str:
        return self.req.elastic.get("rdzv_id") or "none"

    def prepare(self) -> int:
        self.error_dir = elastic_files.make_error_dir(self.log_dir)  # (owner-only, by the run folder's descriptor)
        if self.plan.start_method == "fork":
            warmup.ensure()
        plan = self.plan
        self.events = KernelEvents(
            plan.main_process_ip,
            plan.rdzv_port,
            self.run_id,
            reader=plan.machine_rank == 0,
            # torch's static rendezvous binds the store on machine 0 without falling back; c10d falls back
            may_host=plan.machine_rank == 0 or plan.rdzv_backend == "c10d",
        )
        if self.events.delivers:
            self.render = self.wanted_render
        return plan.rdzv_port

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
            run_id=self.run_id,
            rdzv_endpoint=rendezvous_endpoint(plan),
            rdzv_backend=plan.rdzv_backend,
            rdzv_configs=rdzv_configs,
            max_restarts=req.elastic.get("max_restarts", 0),
            monitor_interval=req.elastic.get("monitor_interval") or 0.1,
            start_method=plan.start_method,
            log_line_prefix_template=req.line_prefix or "[rank ${rank}] ",
        )

    def start(self, recorder) -> None:
        from torch.distributed.launcher.api import elastic_launch

        plan, req = self.plan, self.req
        ranks_render = self.wanted_render if self.events.delivers or plan.machine_rank else "text"
        base = {
            "env": dict(plan.base_env),
            "stdio_from_kernel": plan.start_method == "fork",
            # the ranks' bars travel as events wherever machine 0's cell may draw them; only machine 0 without
            # the store keeps tqdm text bars (teed by torch like the rest of the output)
            "launch": {**launch_settings(plan, ranks_render, req.return_all), "return_all": True},
            "endpoint": (plan.main_process_ip, plan.rdzv_port),
            "run": self.run_id,
        }
        # fork: the workers inherit the function (a cell's whole namespace, say); spawn: the payload launch()
        # pickled once (launch.payload.Payload), as for the local engine
        work = (req.fn, req.args, req.kwargs)
        blob = self.spawn_blob if plan.start_method == "spawn" else work
        launch = elastic_launch(self._config(), _elastic_entry)
        # torch's agent logs every worker failure with its stack; the WorkerError says it once, readably.
        agent_log = logging.getLogger("torch.distributed.elastic")
        self.agent_level = agent_log.level
        agent_log.setLevel(logging.CRITICAL)
        ELASTIC_LAUNCH.launching = True

        def run() -> None:
            # In a thread, torch's agent installs no signal handlers: Ctrl-C stays the kernel's (run_engine's).
            try:
                with ranks_start_undebugged():  # (pydevd's patching switch is per thread)
                    self.ended["values"] = launch(blob, base, self.error_dir)
            except BaseException as e:  # noqa: B036 - told to the recorder by poll()
                self.ended["error"] = e

        self.thread = undebugged(threading.Thread(target=run, name="nblaunch-elastic-agent", daemon=True))
        self.thread.start()
        if threading.current_thread() is threading.main_thread():
            # as torch's agent does in a main thread: a kernel told to end stops its workers first
            for sig in (signal.SIGTERM, signal.SIGHUP):
                self.handlers[sig] = signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        self.stopping = True
        raise LaunchError(
            f"nblaunch: the launch was stopped by {signal.Signals(signum).name}; every local worker was stopped."
        )

    def poll(self, recorder, wait_s: float) -> bool:
        if self.told:
            return True
        self.events.drain(recorder)
        self.thread.join(wait_s)
        if self.stopping:
            self._signal_workers(signal.SIGTERM)  # a worker that started after stop() was asked
        if self.thread.is_alive():
            return False
        self.events.drain(recorder)
        self._tell_end(recorder)
        return True

    def stop(self) -> None:
        """SIGTERM to this machine's workers: torch's agent sees them end, stops the rest and returns."""
        self.stopping = True
        self._signal_workers(signal.SIGTERM)

    def _worker_pids(self) -> list[int]:
        """This machine's workers that are still running: the pids they wrote, each proven to be a child of
        this kernel (torch's agent runs in it) before it is signalled, so a reused pid is never hit."""
        pids = []
        for pid in elastic_files.read_pids(self.error_dir):
            try:
                with open(f"/proc/{pid}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (ValueError, OSError, IndexError):
                continue  # not written yet, or already gone
            if ppid == os.getpid():
                pids.append(pid)
        return pids

    def _signal_workers(self, sig: int) -> None:
        for pid in self._worker_pids():
            try:
                os.kill(pid, sig)
            except OSError:
                pass

    def _tell_end(self, recorder) -> None:
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

        self.told = True
        error = self.ended.get("error")
        if isinstance(error, ChildFailedError):
            self._record_failures(error, recorder)
        elif error is not None:
            recorder.engine_failed(f"torch's elastic launcher failed: {type(error).__name__}: {error}")
        else:
            # rank 0's value on machine 0; elsewhere that machine's first rank's (its cell's result and --return names)
            values = self.ended.get("values") or {}
            for i, r in enumerate(sorted(values)):
                recorder.event(i, "result", values[r])

    def _record_failures(self, e, recorder) -> None:
        # torch lists the failures it saw first; a rank that raised a moment later left its error file too.
        recorded = set(elastic_files.error_ranks(self.error_dir))
        for rank in sorted(set(e.failures) | recorded):
            payload = elastic_files.read_error(self.error_dir, rank)
            if payload is not None:
                recorder.event(rank, "error", payload)
            else:
                pf = e.failures[rank]
                status = ExitStatus(None, -pf.exitcode) if pf.exitcode < 0 else ExitStatus(pf.exitcode, None)
                recorder.exited(rank, status)

    def close(self, grace: float, recorder) -> None:
        if self.thread is not None and self.thread.is_alive():
            self.stop()
            self.thread.join(grace)
            waited = 0.0
            # what ignored SIGTERM is killed; an agent with no worker (still in the rendezvous) is not waited
            # for: it gives up at torch's rendezvous timeout, in its daemon thread
            while self.thread.is_alive() and waited < JOIN_S and self._worker_pids():
                self._signal_workers(signal.SIGKILL)
                self.thread.join(0.2)
                waited += 0.2
            if recorder is not None and not self.thread.is_alive() and not self.told:
                self._tell_end(recorder)
        ELASTIC_LAUNCH.launching = False
        for sig, handler in self.handlers.items():
            signal.signal(sig, handler)
        self.handlers = {}
        if self.agent_level is not None:
            logging.getLogger("torch.distributed.elastic").setLevel(self.agent_level)
            self.agent_level = None
        if self.events is not None:
            self.events.close(recorder)
            self.events = None
