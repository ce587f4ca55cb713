"""The local engine: N worker processes of this kernel, forked or spawned, on this machine.

The kernel holds the rendezvous (a TCPStore on 127.0.0.1, as torchrun's agent does), so two
launches never race for a port; each rank runs the one life cycle (``worker.lifecycle``) and
talks to the kernel over its own pipes, which ``EventLoop`` multiplexes into the recorder.

Example::

    >>> eng = LocalEngine(req, plan, log_dir, sys.stdout, sys.stderr, render="text")    # doctest: +SKIP
    >>> eng.prepare(); eng.start(recorder); eng.poll(recorder, 0.1); eng.close(2.0, recorder)
"""

from __future__ import annotations

import datetime
import os
import signal
import socket

from ..debugger.kernel_proxy import ranks_debugger_address
from ..worker import before_fork
from ..worker.entry import RankStart
from ..worker.gather_agreement import RUN, GatherRelay
from ..worker.lifecycle import RankSpec
from ..worker.result_segments import SegmentFolder
from ..worker.stack_answer import stacks_path
from . import forkserver, warmup
from .contract import Engine, launch_settings
from .local_group import WorkerGroup
from .local_loop import EventLoop


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


class LocalEngine(Engine):
    """Ranks as child processes of the kernel; output and events through pipes."""

    stop_grace_s = 2.0  # SIGTERM → SIGKILL

    def __init__(
        self,
        req,
        plan,
        log_dir: str,
        out,
        err,
        *,
        render: str,
        spawn_blob: bytes | None = None,
        live_namespace: dict | None = None,
    ):
        """``live_namespace``: start live ranks (``worker.live_rank``) that serve requests in this
        namespace (fork: the kernel's own, inherited; spawn: an empty one) instead of running ``req.fn``."""
        self.req, self.plan, self.log_dir, self.out, self.err = req, plan, log_dir, out, err
        self.live_namespace = live_namespace
        self.render = render
        # handed over in a box that start() empties: the kernel holds no extra copy of the
        # pickled arguments once the workers have them
        self.blob_box = [spawn_blob]
        self.group = self.store = self.sock = self.loop = None
        self.port = None
        self.start_method = plan.start_method  # forkserver falls back to spawn when no template can start
        self.template = None
        self.segments: SegmentFolder | None = None  # big return values, in shared memory (prepare() makes it)

    def specs(self) -> list[RankSpec]:
        plan, req = self.plan, self.req
        # (JupyterLab's debugger panel: ranks on this machine connect their debugger to the kernel)
        launch = {**launch_settings(plan, self.render, req.return_all), "debugger": ranks_debugger_address()}
        extra = {"TORCHELASTIC_RESTART_COUNT": str(req.restart_count)}
        return [
            RankSpec.build(
                launch,
                rank=r,
                local_rank=r,
                world_size=plan.num_processes,
                device=plan.device_for(r),
                env={**plan.env_for(r, self.port), **extra},
                leaves_with_exit=True,  # worker/entry.py: os._exit, no destructor runs
                stacks_file=stacks_path(self.log_dir, r),
                result_segments=self.segments or "",
                gather_relay=True,  # the kernel holds the store (start_ranks)
            )
            for r in range(plan.num_processes)
        ]

    def prepare(self) -> int:
        """Before the report exists: the imports forked ranks inherit, and the rendezvous port."""
        if self.plan.start_method == "fork":
            warmup.ensure()
            before_fork.look()  # only what changed since the warm-up's walk: the ranks inherit the rest
        elif self.plan.start_method == "forkserver":
            self.template = forkserver.template_for_launch(self.out)
            self.start_method = "forkserver" if self.template is not None else "spawn"
        self.segments = SegmentFolder.create()
        self.sock = _listen_socket(self.plan.requested_port, self.out)
        self.port = self.sock.getsockname()[1]
        return self.port

    def start(self, recorder) -> None:
        recorder.report.start_method = self.start_method  # forkserver may have fallen back to spawn in prepare()
        recorder.segments = self.segments
        self.start_ranks()
        recorder.add_ranks((w.rank, w.pid) for w in self.group.workers)

    def start_ranks(self) -> None:
        """Start the processes and the rendezvous store (a live session restarts its world with this)."""
        live = self.live_namespace is not None
        work = self.live_namespace if live else (self.req.fn, self.req.args, self.req.kwargs)
        payloads = [RankStart(work=work, spec=s, parent_pid=os.getpid()) for s in self.specs()]
        self.group = WorkerGroup.start(
            payloads,
            self.start_method,
            spawn_blob=self.blob_box.pop(),
            keep_fds=(self.sock.fileno(),),
            live=live,
            template=self.template,
        )
        self.store = _start_store(self.sock, self.port, self.plan.num_processes)
        self.sock = None

    def rank_processes(self) -> list[tuple[int, int, str | None]]:
        if self.group is None:
            return []
        return [(w.rank, w.pid, w.status.describe() if w.status else None) for w in self.group.workers]

    def stop(self) -> None:
        if self.group is not None:  # (None: stopped before any rank started)
            self.group.signal_all(signal.SIGTERM)  # close() follows with SIGKILL after the grace period

    def observe(self, observers) -> None:
        relay = GatherRelay(lambda: self.store, RUN, self.plan.num_processes)  # the ranks' agreement on shards
        observers.watch(relay.on_done, kinds=("done",))

    def poll(self, recorder, wait_s: float) -> bool:
        if self.loop is None:
            self.loop = EventLoop(self.group, recorder)
        return self.loop.poll(wait_s)

    def close(self, grace: float, recorder) -> None:
        if self.loop is not None:
            self.loop.finish()  # every pipe read before the exits are judged
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.group is not None:
            self.group.close(grace=grace)
            for w in self.group.workers:
                if recorder is not None:
                    recorder.final_status(w.rank, w.status)
        self.store = None  # stops the TCPStore server and frees the port
        if self.segments is not None:  # what a failed rank wrote and the kernel never took goes with it
            self.segments.remove()
            self.segments = None
