"""``engine: ray``: the same cell or function on a Ray cluster, through Ray Train's ``TorchTrainer``.

Ray Train places the workers on the cluster and sets up the process group across its
nodes; nblaunch adds no cluster software. What nblaunch adds is the cell display:

- each Ray worker runs the one rank life cycle (``worker.lifecycle.run_rank``, with the process
  group Ray Train set up) through ``_ray_entry``; the events a local worker sends over its pipe
  (``ready``, ``progress``, ``metrics``, ``result``, ``error``) plus its stdout/stderr go, in
  batches, to a small ``_EventSink`` actor;
- the kernel drains that actor into the run recorder, exactly as the local engine's loop does:
  rank 0's lines in the cell, every rank's in ``rank<N>.log``, bars, chart, status line, and
  the failure report. Ranks may run on several machines, so their events are timed on wall time;
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
import io
import os
import sys
import threading
import time

from ..debugger.undebugged import import_undebugged, ranks_start_undebugged, undebugged
from ..errors import LaunchConfigError
from ..worker.context import set_current
from ..worker.lifecycle import RankSpec, run_rank
from .contract import Engine, ExitStatus, launch_settings

FLUSH_S = 0.05
CANCEL_WAIT_S = 15.0


# -- inside a Ray worker ---------------------------------------------------------------------------


class _EventBatcher:
    """Worker side: events and output, sent to the sink actor in batches (at most every FLUSH_S)."""

    def __init__(self, sink, rank: int):
        self.sink, self.rank = sink, rank
        self.items: list = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = undebugged(threading.Thread(target=self._run, name="nblaunch-events", daemon=True))
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
    """What every Ray Train worker runs: the rank life cycle, its events and output sent to the kernel."""
    import cloudpickle
    import ray.train
    import ray.train.torch

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
        spec = RankSpec.build(
            config["launch"],
            rank=rank,
            local_rank=ctx.get_local_rank(),
            world_size=ctx.get_world_size(),
            device=str(ray.train.torch.get_device()),
            env=config["env"],
            init_process_group=False,  # Ray Train has set the process group up across its workers
        )
        end = run_rank(spec, cloudpickle.loads(config["blob"]), events)
        if end.error is not None:
            raise end.error
    finally:
        set_current(None)  # Ray reuses its worker processes
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


def _fit(
    loop_config: dict, backend: str, n: int, use_gpu: bool, per_worker: dict, name: str, storage: str, strategy: str
) -> None:
    """The Ray task that owns the training run: cancelling it stops Ray Train's controller and workers."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    TorchTrainer(
        _ray_entry,
        train_loop_config=loop_config,
        torch_config=TorchConfig(backend=backend),
        scaling_config=ScalingConfig(
            num_workers=n, use_gpu=use_gpu, resources_per_worker=per_worker or None, placement_strategy=strategy
        ),
        run_config=RunConfig(name=name, storage_path=storage, failure_config=FailureConfig(max_failures=0)),
    ).fit()


# -- in the kernel ---------------------------------------------------------------------------------


def connect(address: str, num_cpus: int, *, quiet: bool = False) -> None:
    """Join the Ray cluster at ``address``, or start one on 127.0.0.1 for this kernel when it is 'local'.
    ``quiet``: Ray's own INFO lines ("Connecting to existing Ray cluster...") stay out of the cell.

    With JupyterLab's debugger on, Ray is imported outside its tracing, and the Python processes Ray starts here
    (its dashboard, log monitor) start untouched by it: joined to the kernel's debugger, each would wait for a
    client that never attaches (Ray gives its dashboard up after a minute; the others wait on)."""
    import logging

    ray = import_undebugged("ray")
    level = {"logging_level": logging.WARNING} if quiet else {}

    if ray.is_initialized():
        return
    if address == "local":
        with ranks_start_undebugged():
            ray.init(
                address="local",
                include_dashboard=False,
                _node_ip_address="127.0.0.1",
                num_cpus=num_cpus,
                log_to_driver=False,
                **level,
            )
    else:
        try:
            with ranks_start_undebugged():
                ray.init(address=address, log_to_driver=False, **level)
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


class RayEngine(Engine):
    """The ranks as Ray Train workers; their events reach the recorder through the sink actor."""

    clock = "wall"  # Ray's workers may be on other machines: only wall time orders their events
    stop_grace_s = CANCEL_WAIT_S

    def __init__(self, req, plan, log_dir: str, out, err, *, render: str, spawn_blob: bytes | None = None):
        self.req, self.plan, self.log_dir, self.render, self.blob = req, plan, log_dir, render, spawn_blob
        self.n = plan.num_processes
        self.fit = self.sink = None
        self.stop_t: float | None = None
        self.ended = False  # the fit task's end has been told to the recorder

    def prepare(self) -> int:
        cfg = self.plan.ray
        connect(cfg["address"], max(os.cpu_count() or 1, self.n))
        _check_resources(self.n, dict(cfg["resources_per_worker"]), cfg["use_gpu"], cfg["address"])
        return 0

    def start(self, recorder) -> None:
        import ray

        cfg = self.plan.ray
        recorder.add_ranks((r, 0) for r in range(self.n))
        self.sink = ray.remote(num_cpus=0)(_EventSink).remote()
        loop_config = {
            "sink": self.sink,
            "blob": self.blob,
            "env": dict(self.plan.base_env),
            "launch": launch_settings(self.plan, self.render, self.req.return_all),
        }
        self.blob = None
        self.fit = ray.remote(num_cpus=0, max_retries=0)(_fit).remote(
            loop_config,
            self.plan.backend,
            self.n,
            cfg["use_gpu"],
            dict(cfg["resources_per_worker"]),
            os.path.basename(self.log_dir),
            os.path.join(self.log_dir, "ray"),
            cfg.get("placement_strategy", "PACK"),
        )

    def stop(self) -> None:
        # Ray delivers the cancel as SIGINT in the task, where Ray Train aborts its run gracefully
        # (workers stopped, placement group freed); close() forces it after CANCEL_WAIT_S.
        import ray

        if self.stop_t is None and self.fit is not None:
            self.stop_t = time.monotonic()
            ray.cancel(self.fit, force=False, recursive=False)

    def _drain(self, recorder) -> None:
        import ray

        for rank, kind, payload in ray.get(self.sink.drain.remote()):
            if kind == "output":
                recorder.output(rank, *payload)
            else:
                recorder.event(rank, kind, payload)

    def poll(self, recorder, wait_s: float) -> bool:
        import ray

        if self.ended:
            return True
        done, _ = ray.wait([self.fit], timeout=wait_s)
        self._drain(recorder)
        if not done:
            return False
        self.ended = True
        try:
            ray.get(self.fit)
        except BaseException as e:  # noqa: B036 - the recorder reports it, as a WorkerError
            self._drain(recorder)
            if self.stop_t is None:  # (else it is our own cancel, after a failure, the timeout or Ctrl-C)
                recorder.engine_failed(f"Ray Train failed: {type(e).__name__}: {e}")
            return True
        self._drain(recorder)
        for rr in recorder.report.ranks:
            if rr.done_s is not None:  # the launched code returned on this rank
                recorder.exited(rr.rank, ExitStatus(0, None))
        return True

    def close(self, grace: float, recorder) -> None:
        import ray

        if self.fit is not None:
            if not ray.wait([self.fit], timeout=0)[0]:
                self.stop()
                # a graceful cancel frees Ray Train's placement group for the next launch: give it time,
                # CANCEL_WAIT_S from the cancel (part of it may have passed in run_engine's grace already)
                left = max(grace, CANCEL_WAIT_S - (time.monotonic() - self.stop_t))
                if not ray.wait([self.fit], timeout=max(0.0, left))[0]:
                    ray.cancel(self.fit, force=True, recursive=True)  # kills Ray Train's controller and workers
                    ray.wait([self.fit], timeout=CANCEL_WAIT_S)
        if self.sink is not None:
            ray.kill(self.sink)
