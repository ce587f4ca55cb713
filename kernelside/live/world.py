"""A live session's world: its rank processes, their process group, and restarts.

The processes are the local engine's (``engines.local.LocalEngine``: the same WorkerGroup,
rendezvous store and pipes as a one-shot launch) running live ranks (``worker.live_rank``) that
wait for requests instead of exiting. The world knows what state it is in — one ``WorldState``,
moved only by the world's verbs:

``STARTING`` --ready()--> ``IDLE`` --begin_request()--> ``BUSY`` --end_request()--> ``IDLE``;
``mark_broken(reason)`` (from any state but ``CLOSED``) --> ``BROKEN``: the world cannot go on, and the
restart before the next request says ``broken_because``; ``start()`` / ``restart()`` --> ``STARTING``;
``close()`` --> ``CLOSED``, for good. ``generation`` counts the default process groups rebuilt in place
after a failure (``live.request_engine``); ``restarts`` the new sets of processes.

Two worlds share this interface (``WorldBase``): ``World``, the ranks as this machine's processes, and
``live.ray_world.RayWorld``, the ranks as actors on a Ray cluster (``live.session.make_world`` picks one by
the plan's engine).
The session, the request engine, the Runs entry and the display never ask which one runs.

What runs on it, and when it is restarted, is the session's (``live.session``): each request's engine
says what became of the world (a ``live.request_engine.Verdict``), and the session acts on it.

Example::

    >>> world = World(plan, log_dir, out, err, render="text")   # doctest: +SKIP
    >>> world.start(); world.ready(); world.begin_request(); world.send((0, 1), blob); world.end_request()
    >>> world.close(1.0)
"""

from __future__ import annotations

import dataclasses
import enum
import os
import signal
import time

import cloudpickle

from ..channel import EventReader, frame, write_frame
from ..config import resolve_config
from ..engines.local import LocalEngine
from ..engines.local_group import write_all
from ..engines.local_loop import RankMux
from ..errors import LaunchConfigError
from ..launch.recorder import live_rank_state
from ..launch.request import LaunchRequest
from ..launch.runner import plan_for
from ..run_contract import RankState


class WorldState(enum.Enum):
    """Where a live session's world is; its transitions are in the module docstring."""

    STARTING = "starting"  # new processes, not yet ready (their start-up request runs or is due)
    IDLE = "idle"  # every rank waits for a request
    BUSY = "busy"  # a request runs
    BROKEN = "broken"  # cannot go on (``broken_because`` says why): restarted before the next request
    CLOSED = "closed"  # every rank ended; for good


class WorldFate(enum.Enum):
    """What one request left of the world."""

    KEPT = "kept"  # every rank kept its state, and the process group needed no rebuild
    REBUILT = "rebuilt"  # the process group was rebuilt in the same processes: every rank kept its state
    RESTART = "restart"  # the world cannot go on: new processes, same flags, state gone
    REPLACE = "replace"  # ranks were lost (``lost``): new ones in their places, the others keep their state


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The request engine's judgement of the world after one request; the session acts on it.

    Example::

        >>> Verdict(WorldFate.RESTART, "rank 1 (pid 12) ended: killed by SIGKILL").restarts
        True
    """

    fate: WorldFate
    reason: str | None = None  # RESTART, REPLACE: why, as the error says it ("rank 1 (pid 12) ended: ...")
    lost: tuple[int, ...] = ()  # REPLACE: the ranks lost

    @property
    def restarts(self) -> bool:
        return self.fate is WorldFate.RESTART

    @property
    def loses_state(self) -> bool:
        """Some rank's state is gone after it (every rank's, or the lost ranks')."""
        return self.fate in (WorldFate.RESTART, WorldFate.REPLACE)


KEPT_WORLD = Verdict(WorldFate.KEPT)


def world_plan(arguments: dict, config: str | None, err):
    """The resolved configuration and the plan of a world of these settings (its warnings written to ``err``);
    a world runs its ranks on this machine or on a Ray cluster, so another engine (torch's elastic launcher,
    ``num_machines`` > 1) is refused before anything starts."""
    cfg = resolve_config(arguments, config=config)
    for w in cfg.warnings:
        err.write(f"nblaunch: {w}\n")
    plan = plan_for(cfg)
    if plan.engine not in ("local", "ray"):
        raise LaunchConfigError(
            "engine",
            plan.engine,
            None,
            message=f"a live session runs its ranks on this machine or on a Ray cluster (engine='ray'); "
            f"engine={plan.engine!r} (from {'num_machines' if plan.engine == 'elastic' else 'engine'}) is not "
            "supported for it. Use a one-shot %%distributed cell for that engine, or engine='ray' for live ranks "
            "on several machines. Nothing was started.",
        )
    return cfg, plan


class WorldBase:
    """The world interface: what the session, the request engine, the Runs entry and the display use, whatever
    runs the ranks. Once started, ``group`` has ``workers`` (each with ``rank``, ``pid``, ``status``, ``pidfd``: an
    fd readable once the rank ended, and ``pipes``: the kernel's ends of its stdout, stderr, events, replies and
    requests channels), ``poll(w)`` and ``signal_all(sig)``. ``start()``, ``close()``, ``interrupt()``,
    ``describe()`` and ``status()`` are each implementation's; the verbs of a request's life are shared."""

    group = None  # the implementation's, once started
    port = None  # the rendezvous store's
    segments = None  # a shared-memory folder for big return values, where every rank is on this machine
    replaces_lost = False  # a lost rank is replaced alone (``lost``, ``lost_words``, ``replace``); else a restart

    def __init__(self, plan, log_dir: str, out, err, *, render: str):
        self.plan, self.log_dir, self.out, self.err, self.render = plan, log_dir, out, err, render
        self.mux: RankMux | None = None  # the ranks' selector and ordered readers, one for every request
        self.cells_run: list[int] = []
        self.state = WorldState.STARTING
        self.broken_because: str | None = None
        self.restarts = 0
        self.generation = 0
        self.bytes_written = 0  # every byte written to the ranks' request pipes (all ranks)
        self.made_at = time.monotonic()

    @property
    def started(self) -> bool:
        """The ranks were started once (they may have ended since): ``group`` lists them."""
        return self.group is not None

    def start(self) -> dict:
        """Start the ranks (they come up in the session's start-up request); the namespace they inherit."""
        raise NotImplementedError

    def close(self, grace: float) -> None:
        """Every rank ends; nothing is left. Safe to call twice."""
        raise NotImplementedError

    def interrupt(self, workers) -> None:
        """SIGINT (``KeyboardInterrupt`` in its Python code) to each of these busy ranks; returns at once."""
        raise NotImplementedError

    def restart(self) -> dict:
        """The old ranks are gone at once, new ones start (same flags); every rank's state is gone."""
        self.close(0.2)
        self.restarts += 1
        return self.start()

    def lost(self) -> list:
        """The ranks whose process is gone, in a world that replaces them (``replaces_lost``)."""
        return []

    def _ranks_up(self) -> None:
        """The ranks were started: their selector and ordered readers (every request's), their cell counts."""
        self.mux = RankMux(self.group, [EventReader() for _ in self.group.workers])
        self.cells_run = [0] * len(self.group.workers)

    def _ranks_gone(self) -> None:
        if self.mux is not None:
            self.mux.close()

    # -- the verbs of a request's life ---------------------------------------------------------
    def ready(self) -> None:
        """Every new rank came up (its start-up request ended well): the world waits for requests."""
        self._move(WorldState.IDLE, (WorldState.STARTING, WorldState.IDLE))

    def begin_request(self) -> None:
        self._move(WorldState.BUSY, (WorldState.IDLE,))

    def end_request(self) -> None:
        """The request is over, whatever its outcome (a world it broke stays broken)."""
        self._move(WorldState.IDLE, (WorldState.BUSY,))

    def mark_broken(self, reason: str) -> None:
        """The world cannot go on: ``reason`` is what the restart before the next request says."""
        if self.state is not WorldState.CLOSED:
            self.state, self.broken_because = WorldState.BROKEN, reason

    def _move(self, to: WorldState, allowed: tuple) -> None:
        if self.state in allowed:  # any other state stands: a world broken or closed meanwhile stays so
            self.state = to

    @property
    def up(self) -> bool:
        return self.started and self.state is not WorldState.CLOSED

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
            self.mark_broken(f"sending a request to the ranks failed ({type(e).__name__}), so they could not read it")
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
                    sent = os.write(fd, data)
                finally:
                    os.set_blocking(fd, True)
                if sent < len(data):  # a socket (a Ray world's ranks) may take part of it: the rest must follow
                    write_all(fd, data[sent:])
            except OSError:  # full (a request not read yet) or gone: the rank's exit or restart says the rest
                missed.append(w.rank)
        return missed

    def rank_state(self, w) -> RankState:
        """One rank as ``%distributed_status`` shows it (the one rank-state enum of ``run_contract``)."""
        return live_rank_state(
            process_ended=bool(w.status),
            session_over=False,
            starting=self.state is WorldState.STARTING,
            in_request=RankState.BUSY if self.state is WorldState.BUSY else None,
        )


class World(WorldBase):
    """The ranks of a live session as this machine's processes; see the module docstring."""

    def __init__(self, plan, log_dir: str, out, err, *, render: str, namespace):
        """``namespace()``: the kernel's namespace, which forked ranks inherit (spawned ones start empty)."""
        super().__init__(plan, log_dir, out, err, render=render)
        self.namespace = namespace
        self.engine: LocalEngine | None = None

    @property
    def group(self):
        return self.engine.group if self.engine is not None else None

    @property
    def port(self) -> int:
        return self.engine.port

    @property
    def segments(self):
        return self.engine.segments

    @property
    def store(self):
        """The rendezvous store (the kernel's TCPStore), or None before the ranks start."""
        return self.engine.store if self.engine is not None else None

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
        self._ranks_up()
        self.state, self.broken_because = WorldState.STARTING, None
        return ns

    def close(self, grace: float) -> None:
        """Every rank ends (SIGTERM, SIGKILL after ``grace``); nothing is left. Safe to call twice."""
        if self.engine is not None and self.state is not WorldState.CLOSED:
            self.engine.close(grace, None)  # (the engine stays: its ended ranks are still listed in the final state)
        self._ranks_gone()
        self.state = WorldState.CLOSED

    def interrupt(self, workers) -> None:
        for w in workers:
            try:
                os.killpg(w.pid, signal.SIGINT)
            except (ProcessLookupError, PermissionError):
                pass

    def describe(self, arguments: dict) -> str:
        """'2 ranks, gloo, fork; flags num_processes=2; up 31s': the world as the magics name it."""
        flags = " ".join(f"{k}={v}" for k, v in arguments.items()) or "(defaults)"
        plan = self.plan
        up = time.monotonic() - self.made_at
        return f"{plan.num_processes} ranks, {plan.backend}, {plan.start_method}; flags {flags}; up {up:.0f}s"

    def status(self) -> list[dict]:
        """Per rank: pid, idle/busy, cells run, memory (RSS bytes); empty once closed."""
        if not self.up:
            return []
        return [
            {
                "rank": w.rank,
                "pid": w.pid,
                "state": self.rank_state(w),
                "cells": self.cells_run[w.rank],
                "rss": rss_of(w.pid),
            }
            for w in self.group.workers
        ]


def rss_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return None
