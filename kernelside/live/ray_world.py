"""A live session's world on a Ray cluster: one placement group, one actor per rank, the kernel's channels.

``RayWorld`` is the same world as ``live.world.World`` to everyone above it (``WorldBase``: the session,
the request engine, the Runs entry and the display do not know which one runs). Its start:

1. Ray is joined at ``ray_address`` (``engines.ray_train.connect``: Ray's log forwarding off);
2. one placement group of ``num_processes`` bundles (``live.ray_placement``: ``resources_per_worker``, a GPU
   each with ``use_gpu``), PACK; one that the cluster cannot hold fails within ``PLACEMENT_WAIT_S`` with what
   was asked and what each node has, and nothing is left;
3. one ``worker.ray_live_rank.LiveRankActor`` per bundle says where it is; ranks are ordered by node (the
   kernel's node first, then as the bundles came), then by GPU, as Ray Train orders its workers, and
   ``LOCAL_RANK`` / ``NODE_RANK`` are counted per Ray node id (several nodes may share one IP);
4. the kernel holds the rendezvous store (as in a local world: the rebuild in place after a failure uses
   it), each actor's ``serve()`` connects back to the kernel's channel (``live.ray_channel``) and runs the
   live rank loop in its own process.

A lost rank (its process killed, its node removed: ``live.ray_losses``) is named by rank and node, and
``replace()`` starts a new actor in the bundle it left (Ray places a lost node's bundles again where there is
room); the ranks that stayed keep their state and rebuild the default group with it (``live.rejoin_engine``).

A rank is on the kernel's machine (``here``: the Runs view reads its CPU and memory in this ``/proc``) when its
Ray node has the kernel's node's IP; ``NBLAUNCH_RAY_SAME_MACHINE=node`` counts only the kernel's own Ray node
(several Ray nodes on one machine, as ``ray.cluster_utils.Cluster`` makes them, then look like other machines).
A rank elsewhere reports its own figures on its ``resources`` connection (``live.ray_resources``).

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
from ..errors import LaunchError
from ..worker.lifecycle import RankSpec
from ..worker.ray_live_rank import CHANNELS
from .ray_channel import RayPipes, RayRank, RayRankGroup, accept_ranks
from .ray_losses import by_node, lost_line, nodes_gone, slot_on
from .ray_placement import bundle_of, cluster_has, place, start_actor, strategy_of
from .ray_resources import RankReports
from .world import WorldBase, WorldState, rss_of

START_WAIT_S = 120.0  # the actors' start (a worker process each, imports) and their connections back
KILL_WAIT_S = 10.0  # after ray.kill, how long close() waits for the ranks' processes to end
REPLACE_WAIT_S = 60.0  # a lost rank's bundle placed again (its node gone: on a node that has room) and connected
SAME_MACHINE_ENV = "NBLAUNCH_RAY_SAME_MACHINE"  # "ip" (the default) or "node": what counts as the kernel's machine


@dataclasses.dataclass
class Slot:
    """Where one rank goes: its bundle, its actor, where that actor said it is, its place on its node."""

    bundle: int
    actor: object
    where: dict
    local_rank: int
    node_rank: int
    local_size: int

    @property
    def node_id(self) -> str:
        return self.where["node_id"]


class RayWorld(WorldBase):
    """The ranks of a live session as actors on a Ray cluster; see the module docstring."""

    def __init__(self, plan, log_dir: str, out, err, *, render: str):
        super().__init__(plan, log_dir, out, err, render=render)
        self.group: RayRankGroup | None = None
        self.pg = None
        self.store = None
        self.port = None
        self.node_id: str | None = None  # the kernel's own Ray node
        self.node_ip: str | None = None  # and its IP: ranks on a node with that IP are on the kernel's machine
        self.reports: RankReports | None = None  # what the ranks on other machines say of their resources

    # -- life cycle ------------------------------------------------------------------------
    def start(self) -> dict:
        """Place and start the ranks (they come up in the session's start-up request); they start empty."""
        import ray

        cfg = self.plan.ray
        connect(cfg["address"], max(os.cpu_count() or 1, self.plan.num_processes), quiet=True)
        self.node_id = ray.get_runtime_context().get_node_id()
        self.node_ip = ray.util.get_node_ip_address()
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
        self.bundle = bundle_of(cfg)
        self.pg = place(ray, n, self.bundle, cfg["address"], strategy_of(cfg))
        actors = [start_actor(ray, self.pg, i, self.bundle) for i in range(n)]
        self._actors = actors  # (released by _release if the start fails from here on)
        deadline = time.monotonic() + START_WAIT_S
        where = _get(ray, [a.where.remote() for a in actors], deadline, "say where they are")
        self.host = _kernel_host(ray)
        self.store = _store(self.host, n)
        self.port = self.store.port
        slots = {
            rank: Slot(i, actors[i], where[i], local_rank, node_rank, local_size)
            for rank, (i, local_rank, node_rank, local_size) in enumerate(_order(where, self.node_id))
        }
        self._serving = {}  # (kept: a task whose reference is dropped may be cancelled by Ray)
        self.reports = RankReports(self.log_dir)
        self.group = RayRankGroup(self._connect(ray, slots, deadline, gen=0))
        self._actors = []

    def _connect(self, ray, slots: dict, deadline: float, gen: int) -> list[RayRank]:
        """Each slot's actor serves its rank (``gen``: the rebuilt process group a replacement joins) and connects
        back to the kernel: the ranks, by rank."""
        n = self.plan.num_processes
        listener = socket.create_server((self.host, 0), backlog=4 * n * len(CHANNELS))
        try:
            token = secrets.token_hex(16)
            address = (self.host, listener.getsockname()[1])
            serving = []
            for rank, s in slots.items():
                spec = self._spec(rank, s.local_rank, s.node_rank, s.local_size, s.where, gen)
                elsewhere = not self._here(s.where)
                self._serving[rank] = s.actor.serve.remote(dataclasses.asdict(spec), address, token, elsewhere)
                serving.append(self._serving[rank])
            fds = accept_ranks(listener, token, n, deadline, lambda: _ended(ray, serving), ranks=set(slots))
        finally:
            listener.close()
        for rank, s in slots.items():
            reports = fds[rank].pop("resources")
            if self._here(s.where):
                os.close(reports)
            else:
                self.reports.add(rank, s.where["pid"], reports)
        return [
            RayRank(
                rank=rank,
                pid=s.where["pid"],
                node_id=s.where["node_id"],
                node_ip=s.where["ip"],
                local_rank=s.local_rank,
                node_rank=s.node_rank,
                gpus=s.where["gpus"],
                actor=s.actor,
                pipes=RayPipes(**{_KERNEL_END[c]: fds[rank][c] for c in CHANNELS if c in _KERNEL_END}),
                bundle=s.bundle,
                here=self._here(s.where),
            )
            for rank, s in sorted(slots.items())
        ]

    def _here(self, where: dict) -> bool:
        """Is the actor that said ``where`` on the kernel's machine? (see the module docstring)"""
        if os.environ.get(SAME_MACHINE_ENV, "ip").strip().lower() == "node":
            return where["node_id"] == self.node_id
        return where["ip"] == self.node_ip

    # -- a lost rank or node ------------------------------------------------------------------
    replaces_lost = True  # a lost rank is replaced in its bundle; the others keep their state (live.session)

    def lost(self) -> list[RayRank]:
        """The ranks whose process is gone (killed, its node removed), as their connections say now."""
        return [w for w in self.group.workers if self.group.poll(w) is not None] if self.up else []

    def lost_words(self, lost: list[RayRank]) -> str:
        """What was lost, by node: 'ranks 2, 3 (pids 11, 12) were lost with node 127.0.0.1 (ab12cd34), which left
        the Ray cluster' or 'rank 1 (pid 10) was lost on node ...: its process ended (killed?), the node is up'."""
        gone = nodes_gone(_ray(), {w.node_id for w in lost})
        return "; ".join(lost_line(ws, ws[0].node_id in gone) for ws in by_node(lost))

    def replace(self, lost: list[int]) -> int:
        """New actors for these ranks, each in the bundle its rank left, connected and starting on a process group
        rebuilt in place (the generation returned: the other ranks rebuild to it). A bundle not placed again within
        ``REPLACE_WAIT_S`` (its node gone, no room left) raises a LaunchError saying what the cluster has."""
        ray = _ray()
        gone = [w for w in self.group.workers if w.rank in lost]
        for w in gone:
            self.mux.forget(w)
            self.group.drop(w)
            self.reports.forget(w.rank)
        self.state, self.broken_because = WorldState.STARTING, None
        gen = self.next_generation()
        actors = {w.rank: start_actor(ray, self.pg, w.bundle, self.bundle) for w in gone}
        self._actors = list(actors.values())
        deadline = time.monotonic() + REPLACE_WAIT_S
        try:
            places = _get(ray, [a.where.remote() for a in actors.values()], deadline, "start")
            where = dict(zip(actors, places, strict=True))
        except LaunchError:
            raise LaunchError(
                f"nblaunch: Ray could not place a new actor for rank(s) {', '.join(map(str, actors))} in the "
                f"placement group's freed bundle(s) within {REPLACE_WAIT_S:g}s. The cluster has: "
                f"{cluster_has(ray, self.bundle)}. Add a node with room for it."
            ) from None
        kept = [w for w in self.group.workers if w.rank not in actors]
        slots = {}
        for w in gone:
            local_rank, node_rank, local_size = slot_on(where[w.rank]["node_id"], kept + list(slots.values()))
            slots[w.rank] = Slot(w.bundle, actors[w.rank], where[w.rank], local_rank, node_rank, local_size)
        new = self._connect(ray, slots, deadline, gen)
        self._actors = []
        self.group.workers = sorted(kept + new, key=lambda w: w.rank)
        for w in new:
            self.mux.add(w)
            self.cells_run[w.rank] = 0
        return gen

    def placed_words(self, ranks) -> str:
        """Where the replacements of ``ranks`` are: 'rank 2 is back as a new process (pid 41) on node ...'."""
        back = [
            f"rank {w.rank} is back as a new process (pid {w.pid}) on node {w.node}, local rank {w.local_rank}"
            for w in self.group.workers
            if w.rank in ranks
        ]
        return "; ".join(back) + f"; the process group was rebuilt over all {self.plan.num_processes} ranks"

    def _spec(self, rank: int, local_rank: int, node_rank: int, local_size: int, info: dict, gen: int) -> RankSpec:
        plan, n, host = self.plan, self.plan.num_processes, self.host
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
        # its own GPU by index among those it sees (Ray's masking is off: every GPU of the node, live.ray_placement)
        device = f"cuda:{info['cuda']}" if plan.ray["use_gpu"] and info.get("cuda") is not None else "cpu"
        return RankSpec.build(
            launch_settings(plan, self.render, False),
            rank=rank,
            local_rank=local_rank,
            world_size=n,
            device=device,
            env=env,
            leaves_with_exit=True,  # (worker.ray_live_rank: os._exit, as a local rank)
            group_gen=gen,
            gather_relay=True,  # the kernel holds the store
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
            # killed through Ray at once, and their ends waited for before their requests are closed: an actor that
            # ends its own process (its serve loop ends on its closed requests) is "a worker died unexpectedly" to
            # Ray, whose raylet then prints so into the kernel's output, into whichever cell runs (Ray's kill is
            # asynchronous: closing the requests at once let a rank end first). A live rank between requests has
            # nothing left to write (its results are sent), so no grace is needed.
            group.signal_all(0)
            if not group.wait_ended(time.monotonic() + KILL_WAIT_S):
                group.end_requests()  # (a rank Ray did not end in time ends on its closed requests)
                group.wait_ended(time.monotonic() + max(grace, KILL_WAIT_S))
            group.close_fds()
        for actor in getattr(self, "_actors", []):  # a start that failed before the ranks were connected
            ray.kill(actor, no_restart=True)
        self._actors = []
        if self.reports is not None:
            self.reports.close()
            self.reports = None
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
            f"{self.plan.num_processes} ranks on {nodes} Ray node(s), {self.plan.backend}, "
            f"{strategy_of(self.plan.ray)}; flags {flags}; up {up:.0f}s"
        )

    def status(self) -> list[dict]:
        """Per rank: pid, node, idle/busy, cells run, memory (RSS bytes: a rank on another machine's, as it said)."""
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
                "rss": rss_of(w.pid) if w.here else self.reports.rss(w.rank),
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


def _ray():
    import ray

    return ray


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
