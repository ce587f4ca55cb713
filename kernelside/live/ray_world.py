"""A live session's world on a Ray cluster: one placement group, one actor per rank, the kernel's channels.

``RayWorld`` is the same world as ``live.world.World`` to everyone above it (``WorldBase``: the session,
the request engine, the Runs entry and the display do not know which one runs). Its start:

1. Ray is joined at ``ray_address`` (``engines.ray_train.connect``: Ray's log forwarding off);
2. one placement group of ``num_processes`` bundles (``resources_per_worker``, a GPU each with ``use_gpu``),
   PACK; one that the cluster cannot hold fails within ``PLACEMENT_WAIT_S`` with what was asked and what
   each node has, and nothing is left;
3. one ``worker.ray_live_rank.LiveRankActor`` per bundle says where it is; ranks are ordered by node (the
   kernel's node first, then as the bundles came), then by GPU, as Ray Train orders its workers, and
   ``LOCAL_RANK`` / ``NODE_RANK`` are counted per Ray node id (several nodes may share one IP);
4. the kernel holds the rendezvous store (as in a local world: the rebuild in place after a failure uses
   it), each actor's ``serve()`` connects back to the kernel's channel (``live.ray_channel``) and runs the
   live rank loop in its own process.

``close()`` ends every rank (request channels closed, then ``ray.kill`` after the grace), removes the
placement group and waits (bounded) until every rank's process let go of its connections.

Example::

    >>> world = RayWorld(plan, log_dir, out, err, render="text")   # doctest: +SKIP
    >>> world.start(); ...; world.close(1.0)
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import secrets
import socket
import time

from ..engines.contract import launch_settings
from ..engines.ray_train import connect
from ..errors import LaunchConfigError, LaunchError
from ..worker.lifecycle import RankSpec
from ..worker.ray_live_rank import CHANNELS, LiveRankActor
from .ray_channel import RayPipes, RayRank, RayRankGroup, accept_ranks
from .world import WorldBase, WorldState, rss_of

PLACEMENT_WAIT_S = 10.0  # a placement group not ready by then cannot be placed: the start fails, saying why
START_WAIT_S = 120.0  # the actors' start (a worker process each, imports) and their connections back
KILL_WAIT_S = 10.0  # after ray.kill, how long close() waits for the ranks' processes to end
STRATEGY = "PACK"


class RayWorld(WorldBase):
    """The ranks of a live session as actors on a Ray cluster; see the module docstring."""

    def __init__(self, plan, log_dir: str, out, err, *, render: str):
        super().__init__(plan, log_dir, out, err, render=render)
        self.group: RayRankGroup | None = None
        self.pg = None
        self.store = None
        self.port = None
        self.node_id: str | None = None  # the kernel's own Ray node

    # -- life cycle ------------------------------------------------------------------------
    def start(self) -> dict:
        """Place and start the ranks (they come up in the session's start-up request); they start empty."""
        import ray

        cfg = self.plan.ray
        connect(cfg["address"], max(os.cpu_count() or 1, self.plan.num_processes), quiet=True)
        self.node_id = ray.get_runtime_context().get_node_id()
        self.group, self.state, self.broken_because = None, WorldState.STARTING, None
        try:
            self._start(ray, cfg)
        except BaseException:
            self._release()
            raise
        self._ranks_up()
        return {}

    def _start(self, ray, cfg: dict) -> None:
        n = self.plan.num_processes
        bundle = _bundle(cfg)
        self.pg = _place(ray, n, bundle, cfg["address"])
        actors = [_actor(ray, self.pg, i, bundle) for i in range(n)]
        self._actors = actors  # (released by _release if the start fails from here on)
        deadline = time.monotonic() + START_WAIT_S
        where = _get(ray, [a.where.remote() for a in actors], deadline, "say where they are")
        order = _order(where, self.node_id)
        host = _kernel_host(ray)
        listener = socket.create_server((host, 0), backlog=4 * n * len(CHANNELS))
        try:
            self.store = _store(host, n)
            self.port = self.store.port
            token = secrets.token_hex(16)
            address = (host, listener.getsockname()[1])
            serving, ranks = [], []
            for rank, (i, local_rank, node_rank, local_size) in enumerate(order):
                info = where[i]
                spec = self._spec(rank, local_rank, node_rank, local_size, info, host)
                serving.append(actors[i].serve.remote(dataclasses.asdict(spec), address, token))
                ranks.append((rank, i, info, local_rank, node_rank))
            fds = accept_ranks(listener, token, n, deadline, lambda: _ended(ray, serving))
        finally:
            listener.close()
        self.group = RayRankGroup(
            [
                RayRank(
                    rank=rank,
                    pid=info["pid"],
                    node_id=info["node_id"],
                    node_ip=info["ip"],
                    local_rank=local_rank,
                    node_rank=node_rank,
                    gpus=info["gpus"],
                    actor=actors[i],
                    pipes=RayPipes(**{_KERNEL_END[c]: fds[rank][c] for c in CHANNELS}),
                )
                for rank, i, info, local_rank, node_rank in ranks
            ]
        )
        self._actors = []
        self._serving = serving  # (kept: a task whose reference is dropped may be cancelled by Ray)

    def _spec(self, rank: int, local_rank: int, node_rank: int, local_size: int, info: dict, host: str) -> RankSpec:
        plan, n = self.plan, self.plan.num_processes
        env = dict(plan.base_env)
        if host.startswith("127.") and "GLOO_SOCKET_IFNAME" not in os.environ:
            env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # every node on this machine: everything on 127.0.0.1
        env.update(
            RANK=str(rank),
            LOCAL_RANK=str(local_rank),
            WORLD_SIZE=str(n),
            LOCAL_WORLD_SIZE=str(local_size),
            NODE_RANK=str(node_rank),
            GROUP_RANK=str(node_rank),
            ROLE_RANK=str(rank),
            ROLE_WORLD_SIZE=str(n),
            MASTER_ADDR=host,
            MASTER_PORT=str(self.port),
            TORCHELASTIC_USE_AGENT_STORE="True",  # the store is the kernel's: rank 0 connects to it as every rank
        )
        device = "cuda:0" if plan.ray["use_gpu"] and info["gpus"] else "cpu"  # Ray shows each actor its own GPU
        return RankSpec.build(
            launch_settings(plan, self.render, False),
            rank=rank,
            local_rank=local_rank,
            world_size=n,
            device=device,
            env=env,
            leaves_with_exit=True,  # (worker.ray_live_rank: os._exit, as a local rank)
        )

    def close(self, grace: float) -> None:
        """Every rank ends (its requests closed, ``ray.kill`` after ``grace``), the placement group is removed,
        and every rank's process has let go of its connections (bounded wait). Safe to call twice."""
        if self.state is not WorldState.CLOSED:
            self._release(grace)
        self._ranks_gone()
        self.state = WorldState.CLOSED

    def _release(self, grace: float = 0.0) -> None:
        import ray

        group = self.group
        if group is not None and not group.closed:
            # killed through Ray at once, not left to end on their closed requests: an actor that ends its own
            # process is "a worker died unexpectedly" to Ray, which says so in the kernel's output. A live rank
            # between requests has nothing left to write (its results are sent), so no grace is needed.
            group.signal_all(0)
            group.end_requests()
            group.wait_ended(time.monotonic() + max(grace, KILL_WAIT_S))
            group.close_fds()
        for actor in getattr(self, "_actors", []):  # a start that failed before the ranks were connected
            ray.kill(actor, no_restart=True)
        self._actors = []
        if self.pg is not None:
            try:
                ray.util.remove_placement_group(self.pg)
            except Exception:  # noqa: BLE001 - Ray gone (the kernel's ray.shutdown()): nothing of it is left
                pass
            self.pg = None
        self.store = None  # the rendezvous store's server ends with it

    def interrupt(self, workers) -> None:
        self.group.interrupt(workers)

    # -- what it is ------------------------------------------------------------------------
    def describe(self, arguments: dict) -> str:
        """'4 ranks on 2 Ray nodes, gloo, PACK; flags num_processes=4 engine=ray; up 31s'."""
        flags = " ".join(f"{k}={v}" for k, v in arguments.items()) or "(defaults)"
        nodes = len({w.node_id for w in self.group.workers}) if self.group is not None else 0
        up = time.monotonic() - self.made_at
        return (
            f"{self.plan.num_processes} ranks on {nodes} Ray node(s), {self.plan.backend}, {STRATEGY}; "
            f"flags {flags}; up {up:.0f}s"
        )

    def status(self) -> list[dict]:
        """Per rank: pid, node, idle/busy, cells run, memory (RSS bytes, for ranks on the kernel's node)."""
        if not self.up:
            return []
        return [
            {
                "rank": w.rank,
                "pid": w.pid,
                "node": w.node,
                "local_rank": w.local_rank,
                "state": self.rank_state(w),
                "cells": self.cells_run[w.rank],
                "rss": rss_of(w.pid) if w.node_id == self.node_id else None,
            }
            for w in self.group.workers
        ]


_KERNEL_END = {
    "stdout": "stdout_r",
    "stderr": "stderr_r",
    "events": "events_r",
    "replies": "replies_w",
    "requests": "requests_w",
    "control": "control",
}


def _bundle(cfg: dict) -> dict:
    per_worker = {str(k): float(v) for k, v in dict(cfg["resources_per_worker"]).items()}
    bundle = {"CPU": per_worker.pop("CPU", 1.0)}
    if cfg["use_gpu"]:
        bundle["GPU"] = per_worker.pop("GPU", 1.0)
    bundle.update(per_worker)
    return bundle


def _place(ray, n: int, bundle: dict, address: str):
    """The placement group, ready; or a LaunchConfigError within PLACEMENT_WAIT_S, and nothing left."""
    from ray.util.placement_group import placement_group, remove_placement_group

    pg = placement_group([dict(bundle) for _ in range(n)], strategy=STRATEGY)
    ready, _ = ray.wait([pg.ready()], timeout=PLACEMENT_WAIT_S)
    if ready:
        return pg
    remove_placement_group(pg)
    asked = ", ".join(f"{k} {v:g}" for k, v in bundle.items())
    raise LaunchConfigError(
        "num_processes",
        n,
        None,
        message=f"the Ray cluster at {address!r} cannot place {n} live ranks of {{{asked}}} each ({STRATEGY}) within "
        f"{PLACEMENT_WAIT_S:g}s. The cluster has: {_cluster_has(ray, bundle)}. Use fewer processes, smaller "
        "resources_per_worker, or a larger cluster. Nothing was started.",
    )


def _cluster_has(ray, bundle: dict) -> str:
    nodes = [nd for nd in ray.nodes() if nd.get("Alive")]
    free = ray.available_resources()
    parts = []
    for nd in nodes:
        res = nd.get("Resources", {})
        have = ", ".join(f"{k} {res.get(k, 0):g}" for k in bundle)
        parts.append(f"node {nd.get('NodeManagerAddress')} ({nd['NodeID'][:8]}): {have}")
    total = ", ".join(f"{k} {free.get(k, 0):g}" for k in bundle)
    return f"{'; '.join(parts) or 'no live node'}; free now in all: {total}"


def _actor(ray, pg, index: int, bundle: dict):
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    rest = {k: v for k, v in bundle.items() if k not in ("CPU", "GPU")}
    return (
        ray.remote(LiveRankActor)
        .options(
            num_cpus=bundle["CPU"],
            num_gpus=bundle.get("GPU", 0),
            resources=rest or None,
            max_restarts=0,
            max_task_retries=0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=index),
        )
        .remote()
    )


def _get(ray, refs: list, deadline: float, what: str) -> list:
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=max(0.0, deadline - time.monotonic()))
    if len(ready) < len(refs):
        raise LaunchError(f"nblaunch: the live ranks' Ray actors did not {what} within {START_WAIT_S:g}s.")
    return ray.get(refs)


def _order(where: list[dict], kernel_node: str) -> list[tuple[int, int, int, int]]:
    """(actor index, local rank, node rank, ranks on its node) in rank order: by node, the kernel's first and
    then as the bundles came, then by GPU (as Ray Train orders its workers)."""
    nodes: list[str] = []
    for info in where:
        if info["node_id"] not in nodes:
            nodes.append(info["node_id"])
    nodes.sort(key=lambda nd: nd != kernel_node)  # (a stable sort: bundle order otherwise)
    out = []
    for node_rank, node in enumerate(nodes):
        here = [i for i, info in enumerate(where) if info["node_id"] == node]
        here.sort(key=lambda i: (_first_gpu(where[i]["gpus"]), i))
        out.extend((i, local_rank, node_rank, len(here)) for local_rank, i in enumerate(here))
    return out


def _first_gpu(gpus: list) -> int:
    ids = [g for g in gpus if isinstance(g, int)]
    return min(ids) if ids else -1


def _kernel_host(ray) -> str:
    """The kernel's address as the ranks reach it: its Ray node's IP (127.0.0.1 for a cluster on this machine)."""
    return ray.util.get_node_ip_address()


def _store(host: str, n: int):
    from torch.distributed import TCPStore

    return TCPStore(host, 0, n, True, datetime.timedelta(seconds=300), wait_for_workers=False)


def _ended(ray, serving: list) -> str | None:
    """Why a rank will never connect back: its actor's ``serve()`` ended (an import error, the actor died)."""
    done, _ = ray.wait(serving, num_returns=1, timeout=0)
    if not done:
        return None
    try:
        ray.get(done[0])
    except Exception as e:  # noqa: BLE001 - said as the reason the start failed
        return f"a live rank's Ray actor ended before it connected back to the kernel: {type(e).__name__}: {e}"
    return "a live rank's Ray actor ended before it connected back to the kernel"
