"""A live session's world: its rank processes, their process group, and restarts.

The processes are the local engine's (``engines.local.LocalEngine``: the same WorkerGroup,
rendezvous store and pipes as a one-shot launch) running live ranks (``worker.live_rank``) that
wait for requests instead of exiting. The world knows what state it is in — one field, ``state``:

``starting`` → ``idle`` ⇄ ``busy`` → ``closed``, and ``broken`` (a request could not be written
whole: the next request restarts it first). ``generation`` counts the default process groups
rebuilt in place after a failure (``live.request_engine``); ``restarts`` the new sets of processes.

What runs on it, and when it is restarted, is the session's (``live.session``) and its requests'.

Example::

    >>> world = World(plan, log_dir, out, err, render="text")   # doctest: +SKIP
    >>> world.start(); world.send((0, 1), blob); world.close(1.0)
"""

from __future__ import annotations

import os

import cloudpickle

from ..channel import EventReader, frame, write_frame
from ..engines.local import LocalEngine
from ..launch.recorder import live_rank_state
from ..launch.request import LaunchRequest
from ..run_contract import RankState

STATES = ("starting", "idle", "busy", "broken", "closed")


class World:
    """The ranks of a live session; see the module docstring."""

    def __init__(self, plan, log_dir: str, out, err, *, render: str, namespace):
        """``namespace()``: the kernel's namespace, which forked ranks inherit (spawned ones start empty)."""
        self.plan, self.log_dir, self.out, self.err, self.render = plan, log_dir, out, err, render
        self.namespace = namespace
        self.engine: LocalEngine | None = None
        self.readers: list[EventReader] = []
        self.cells_run: list[int] = []
        self.state = "starting"
        self.broken_because: str | None = None
        self.restarts = 0
        self.generation = 0
        self.bytes_written = 0  # every byte written to the ranks' request pipes (all ranks)

    @property
    def group(self):
        return self.engine.group

    @property
    def port(self) -> int:
        return self.engine.port

    def start(self) -> dict:
        """Start the processes (they come up in the session's start-up request); the namespace they inherit."""
        fork = self.plan.start_method == "fork"
        ns = self.namespace() if fork else {}
        blob = None if fork else cloudpickle.dumps(None)
        engine = LocalEngine(
            LaunchRequest(fn=None),
            self.plan,
            self.log_dir,
            self.out,
            self.err,
            render=self.render,
            spawn_blob=blob,
            live_namespace=ns,
        )
        engine.prepare()
        self.engine = engine
        engine.start_ranks()
        self.readers = [EventReader() for _ in engine.group.workers]
        self.cells_run = [0] * len(engine.group.workers)
        self.state, self.broken_because = "starting", None
        return ns

    def restart(self) -> dict:
        """The old ranks are gone at once, new ones start (same flags); every rank's state is gone."""
        self.close(0.2)
        self.restarts += 1
        return self.start()

    def close(self, grace: float) -> None:
        """Every rank ends (SIGTERM, SIGKILL after ``grace``); nothing is left. Safe to call twice."""
        if self.engine is not None and self.state != "closed":
            self.engine.close(grace, None)  # (the engine stays: its ended ranks are still listed in the final state)
        self.state = "closed"

    @property
    def up(self) -> bool:
        return self.engine is not None and self.state != "closed"

    def next_generation(self) -> int:
        """The number of the next default process group rebuilt in place (its store prefix)."""
        self.generation += 1
        return self.generation

    def send(self, ranks, blob: bytes) -> None:
        """Write one request to these ranks' request pipes (an idle rank's reader thread takes it at once)."""
        try:
            for w in self.group.workers:
                if w.rank in ranks:
                    write_frame(w.pipes.requests_w, blob)
                    self.bytes_written += len(blob) + 8
        except BaseException as e:
            # a request cut in half leaves the rank's stream unreadable: this world cannot go on
            self.state, self.broken_because = "broken", f"sending the request failed ({type(e).__name__})"
            raise

    def send_control(self, ranks, blob: bytes) -> list[int]:
        """Write a small control message (``where``, ``abort``) to these ranks without ever blocking: the kernel
        loop must not wait on a rank whose reader is busy. One write of a whole frame under PIPE_BUF is atomic:
        it lands whole or not at all. Returns the ranks it did not reach."""
        data = frame(blob)
        missed = []
        for w in self.group.workers:
            if w.rank not in ranks:
                continue
            fd = w.pipes.requests_w
            try:
                os.set_blocking(fd, False)
                try:
                    os.write(fd, data)
                finally:
                    os.set_blocking(fd, True)
            except OSError:  # full (a request not read yet) or gone: the rank's exit or restart says the rest
                missed.append(w.rank)
        return missed

    def rank_state(self, w) -> RankState:
        """One rank as ``%distributed_status`` shows it (the one rank-state enum of ``run_contract``)."""
        return live_rank_state(
            process_ended=bool(w.status),
            session_over=False,
            starting=self.state == "starting",
            in_request=RankState.BUSY if self.state == "busy" else None,
        )
