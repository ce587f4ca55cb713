"""``engine: ray``: the same cell or function on a Ray cluster, through Ray Train's ``TorchTrainer``.

Ray Train places the workers on the cluster and sets up the process group across its
nodes; nblaunch adds no cluster software. What nblaunch adds is the cell display:

- each Ray worker runs the payload through ``_ray_entry``, which sends what a local worker
  sends over its event pipe (``ready``, ``progress``, ``metrics``, ``result``, ``error``)
  plus its stdout/stderr, in batches, to a small ``_EventSink`` actor;
- the kernel drains that actor and feeds the same pieces the local engine uses:
  ``RankOutputRouter`` (rank 0's lines in the cell, every rank's in ``rank<N>.log``),
  ``RunDisplay`` (bars, chart, status line) and the failure report;
- ``trainer.fit()`` runs in a Ray task that the kernel owns: on the first error, a timeout
  or Ctrl-C, cancelling that task takes Ray Train's controller and workers down with it.

With ``ray_address: local`` the kernel starts a Ray of its own on 127.0.0.1 (kept for the
next launch, stopped with ``ray.shutdown()`` or the kernel); otherwise it connects to the
cluster at that address. Ray is an optional extra: ``pip install 'nblaunch[ray]'``.

Example::

    >>> notebook_launcher(train, num_processes=2, engine="ray")   # doctest: +SKIP
"""

from __future__ import annotations

import builtins
import importlib.util
import io
import os
import sys
import threading
import time

from .errors import LaunchConfigError, LaunchTimeoutError, WorkerError
from .group import ExitStatus
from .plan import LaunchPlan
from .progress import RENDER_ENV, SCOPE_ENV
from .report import Failure, LaunchReport, RankReport, format_failure_message

FLUSH_S = 0.05
POLL_S = 0.05
CANCEL_WAIT_S = 15.0
INSTALL_HINT = "pip install 'nblaunch[ray]' (or pip install 'ray[train]')"


def require_ray() -> None:
    """A clear error, before anything starts, when Ray Train is not installed."""
    try:
        found = importlib.util.find_spec("ray") is not None and importlib.util.find_spec("ray.train") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise LaunchConfigError(
            "engine",
            "ray",
            None,
            message=f"engine='ray' needs Ray Train, which is not installed in this kernel's environment "
            f"({sys.executable}). Install it with {INSTALL_HINT}, or use engine='local'. Nothing was started.",
        )


# -- inside a Ray worker ---------------------------------------------------------------------------


class _EventBatcher:
    """Worker side: events and output, sent to the sink actor in batches (at most every FLUSH_S)."""

    def __init__(self, sink, rank: int):
        self.sink, self.rank = sink, rank
        self.items: list = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="nblaunch-events", daemon=True)
        self.thread.start()

    def send(self, kind: str, payload=None) -> None:
        with self.lock:
            self.items.append((self.rank, kind, payload))

    def send_result(self, body: bytes) -> None:
        self.send("result", body)

    def output(self, stream: str, data: bytes) -> None:
        self.send("output", (stream, data))

    def flush(self, wait: bool = False) -> None:
        with self.lock:
            batch, self.items = self.items, []
        if batch:
            ref = self.sink.put.remote(batch)
            if wait:
                import ray

                ray.get(ref)

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.flush(wait=True)

    def _run(self) -> None:
        while not self.stop.wait(FLUSH_S):
            self.flush()


class _EventStream(io.TextIOBase):
    """sys.stdout / sys.stderr of a Ray worker during the run: text goes to the kernel as output events."""

    def __init__(self, events: _EventBatcher, name: str):
        self.events, self.name = events, name

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        if s:
            self.events.output(self.name, s.encode("utf-8", errors="backslashreplace"))
        return len(s)


def _ray_entry(config: dict) -> None:
    """What every Ray Train worker runs: the payload, with nblaunch's worker contract around it."""
    import cloudpickle
    import ray.train
    import ray.train.torch

    from . import worker
    from .progress import finish_in_worker, install_in_worker

    ctx = ray.train.get_context()
    rank = ctx.get_world_rank()
    events = _EventBatcher(config["sink"], rank)
    saved = sys.stdout, sys.stderr, builtins.print
    sys.stdout, sys.stderr = _EventStream(events, "stdout"), _EventStream(events, "stderr")
    # Ray Train replaces print() in its workers with one that also logs each line, and its log handler
    # writes to the same stream: the plain print for the run, or every printed line shows twice.
    patched = sys.modules.get("ray.train.v2._internal.logging.patch_print")
    builtins.print = getattr(patched, "_original_print", builtins.print)
    try:
        os.environ.update(config["env"])
        device = str(ray.train.torch.get_device())
        worker.CURRENT = worker.WorkerContext(rank, ctx.get_local_rank(), ctx.get_world_size(), device, events)
        install_in_worker()
        events.send("ready", {"t": time.time(), "pid": os.getpid()})
        fn, args, kwargs = cloudpickle.loads(config["blob"])
        worker._patch_init_process_group([getattr(fn, "__globals__", {})])
        value = fn(*args, **kwargs)
        finish_in_worker()
        events.send("done", {"t": time.time()})
        if rank == 0 or config["return_all"]:
            events.send_result(worker.dumps_result(worker.unwrap_for_return(value)))
    except BaseException as e:
        payload = worker._error_payload(e, "run")
        payload["t"] = time.time()  # ranks may be on different machines: wall time orders them
        events.send("error", payload)
        raise
    finally:
        worker.CURRENT = None
        sys.stdout, sys.stderr, builtins.print = saved
        events.close()


class _EventSink:
    """A Ray actor that holds worker events until the kernel drains them."""

    def __init__(self):
        self.items: list = []

    def put(self, batch: list) -> None:
        self.items.extend(batch)

    def drain(self) -> list:
        out, self.items = self.items, []
        return out


def _fit(loop_config: dict, backend: str, n: int, use_gpu: bool, per_worker: dict, name: str, storage: str) -> None:
    """The Ray task that owns the training run: cancelling it stops Ray Train's controller and workers."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    TorchTrainer(
        _ray_entry,
        train_loop_config=loop_config,
        torch_config=TorchConfig(backend=backend),
        scaling_config=ScalingConfig(num_workers=n, use_gpu=use_gpu, resources_per_worker=per_worker or None),
        run_config=RunConfig(name=name, storage_path=storage, failure_config=FailureConfig(max_failures=0)),
    ).fit()


# -- in the kernel ---------------------------------------------------------------------------------


def connect(address: str, num_cpus: int) -> None:
    """Join the Ray cluster at ``address``, or start one on 127.0.0.1 for this kernel when it is 'local'."""
    import ray

    if ray.is_initialized():
        return
    if address == "local":
        ray.init(
            address="local",
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            num_cpus=num_cpus,
            log_to_driver=False,
        )
    else:
        try:
            ray.init(address=address, log_to_driver=False)
        except ConnectionError as e:
            raise LaunchConfigError(
                "ray_address",
                address,
                None,
                message=f"cannot reach the Ray cluster at ray_address={address!r}: {e}. Start it (ray start --head) "
                "or fix the address; 'local' starts a Ray for this kernel. Nothing was started.",
            ) from None


def _check_resources(n: int, per_worker: dict, use_gpu: bool, address: str) -> None:
    import ray

    have = ray.cluster_resources()
    need = {"CPU": float(per_worker.get("CPU", 1)) * n}
    if use_gpu:
        need["GPU"] = float(per_worker.get("GPU", 1)) * n
    for k, v in per_worker.items():
        need.setdefault(k, float(v) * n)
    short = [f"{k}: {v:g} needed, {have.get(k, 0):g} in the cluster" for k, v in need.items() if have.get(k, 0) < v]
    if short:
        raise LaunchConfigError(
            "num_processes",
            n,
            None,
            message=f"the Ray cluster at {address!r} cannot place {n} workers ({'; '.join(short)}). Use fewer "
            "processes, smaller resources_per_worker, or a larger cluster. Nothing was started.",
        )


def launch_ray(req, plan: LaunchPlan, blob: bytes, log_dir: str, out, err):
    """Run the request on Ray; returns the engine's LaunchOutcome or raises WorkerError."""
    require_ray()
    import cloudpickle
    import ray

    from .engine import LaunchOutcome, _state
    from .output import RankOutputRouter
    from .progress_view import make_run_display, render_mode

    n, ray_cfg = plan.num_processes, plan.ray
    t_call = time.monotonic()
    connect(ray_cfg["address"], max(os.cpu_count() or 1, n))
    per_worker = dict(ray_cfg["resources_per_worker"])
    _check_resources(n, per_worker, ray_cfg["use_gpu"], ray_cfg["address"])

    report = LaunchReport(
        world_size=n, backend=plan.backend, start_method="ray", port=0, log_dir=log_dir, started_at=time.time()
    )
    _state["last_report"] = report
    render = render_mode(plan.output)
    router = RankOutputRouter(n, plan.output, log_dir, out, err, prefix_template=req.line_prefix)
    report.ranks = [RankReport(rank=r, pid=0, log_path=router.log_paths[r]) for r in range(n)]
    display = make_run_display(report, plan.output, plan.progress) if render == "widgets" else None

    sink = ray.remote(num_cpus=0)(_EventSink).remote()
    loop_config = {
        "sink": sink,
        "blob": blob,
        "env": {**plan.base_env, RENDER_ENV: render, SCOPE_ENV: plan.progress},
        "return_all": req.return_all,
    }
    fit = ray.remote(num_cpus=0, max_retries=0)(_fit).remote(
        loop_config,
        plan.backend,
        n,
        ray_cfg["use_gpu"],
        per_worker,
        os.path.basename(log_dir),
        os.path.join(log_dir, "ray"),
    )
    results: list = [None] * n
    fit_error: BaseException | None = None
    stopped = False
    stop_t = [0.0]

    def stop() -> None:
        # Ray delivers the cancel as SIGINT in the task, where Ray Train aborts its run gracefully
        # (workers stopped, placement group freed); see finish_stop() for the forced fallback.
        nonlocal stopped
        if not stopped:
            stopped = True
            stop_t[0] = time.monotonic()
            ray.cancel(fit, force=False, recursive=False)

    def handle(rank: int, kind: str, payload) -> None:
        rr = report.ranks[rank]
        if kind == "output":
            router.feed(rank, *payload)
            return
        report.event_counts[kind] = report.event_counts.get(kind, 0) + 1
        if kind == "ready":
            rr.pid, rr.ready_s = payload["pid"], time.monotonic() - t_call
            if all(r.ready_s is not None for r in report.ranks):
                report.startup_s = max(r.ready_s for r in report.ranks)
        elif kind == "done":
            rr.done_s = time.monotonic() - t_call
            rr.status = ExitStatus(0, None)  # the launched code returned on this rank
        elif kind == "result":
            results[rank] = payload
        elif kind == "metrics":
            report.metrics.extend(payload)
        elif kind == "error":
            report.failures.append(Failure.from_error(rank, payload))
            report.outcome = "failed"
            stop()
        if display is not None and kind in ("progress", "metrics"):
            display.on_event(rank, kind, payload)

    def drain() -> None:
        for rank, kind, payload in ray.get(sink.drain.remote()):
            handle(rank, kind, payload)

    try:
        if display is not None:
            display.show()
        deadline = t_call + plan.timeout if plan.timeout else None
        while True:
            done, _ = ray.wait([fit], timeout=POLL_S)
            drain()
            router.flush_stale()
            if display is not None:
                display.tick()
            if done:
                break
            if stopped and time.monotonic() - stop_t[0] > CANCEL_WAIT_S:
                ray.cancel(fit, force=True, recursive=True)  # kills Ray Train's controller and workers with it
                ray.wait([fit], timeout=CANCEL_WAIT_S)
                break
            if deadline is not None and time.monotonic() >= deadline and not stopped:
                report.failures.append(
                    Failure(
                        rank=None,
                        kind="timeout",
                        t=time.monotonic(),  # comparable with the workers' error events
                        message=f"the run exceeded timeout={plan.timeout:g}s and the Ray job was stopped",
                    )
                )
                report.outcome = "timeout"
                stop()
        try:
            ray.get(fit)
        except BaseException as e:  # noqa: B036 - the failure is reported below, as a WorkerError
            fit_error = e
        drain()
    except KeyboardInterrupt as e:
        report.outcome = "interrupted"
        stop()
        if not ray.wait([fit], timeout=CANCEL_WAIT_S)[0]:
            ray.cancel(fit, force=True, recursive=True)
        if display is not None:
            display.finish(e)
        raise
    finally:
        router.finish()
        ray.kill(sink)
        report.wall_s = time.monotonic() - t_call
        report.ended_at = time.time()
    if fit_error is not None and not report.failures:
        report.failures.append(
            Failure(
                rank=None,
                kind="exit",
                t=time.monotonic(),  # comparable with the workers' error events
                message=f"Ray Train failed: {type(fit_error).__name__}: {fit_error}",
            )
        )
    if report.failures:
        report.outcome = report.outcome if report.outcome != "running" else "failed"
        root = report.root_cause()
        if root.rank is None and root.kind != "timeout":
            message = f"nblaunch: {root.message}\nlogs of every rank: {log_dir}"
        else:
            message = format_failure_message(report, root, router)
        cls = LaunchTimeoutError if report.outcome == "timeout" else WorkerError
        error = cls(message, rank=root.rank, failures=report.failures, report=report)
        if display is not None:
            display.finish(error)
        raise error
    report.outcome = "ok"
    if display is not None:
        display.finish(None)
    values = [cloudpickle.loads(b) if b is not None else None for b in results]
    return LaunchOutcome(values[0], values if req.return_all else None, report)
