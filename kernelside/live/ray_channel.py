"""The kernel's end of a Ray world's channels: one TCP connection per rank and channel, as the world's group.

Each rank's actor (``worker.ray_live_rank``) connects back to a listening socket of the kernel once per channel
(``CHANNELS``) and introduces the connection with ``hello`` (the world's token, its rank, the channel); the
kernel keeps the connections whose token is its world's. Their fds stand where a local rank's pipes stand
(``RankPipes``' names), so the kernel loop (``engines.local_loop``), the ordered readers and the stdin relay
read and write them unchanged; the ``control`` connection stands for the pidfd: the rank's process holds it
until it ends, so its end is readable at once (a killed actor, a lost node: the kernel's TCP end sees it).

Example::

    >>> ranks = accept_ranks(listener, token, 4, deadline, failed)      # doctest: +SKIP
    >>> ranks[0].pipes.events_r
"""

from __future__ import annotations

import dataclasses
import hmac
import os
import select
import socket
import time

from ..engines.contract import ExitStatus
from ..engines.local_group import close_quietly
from ..worker.ray_live_rank import CHANNELS, HELLO_MAX, INTERRUPT


class ActorEnded(ExitStatus):
    """How a rank on Ray ended, as far as the kernel can see: its process let go of its connections."""

    def __init__(self, what: str):
        super().__init__(1, None)  # (no exit code reaches the kernel across machines: 1, as torch's failures need one)
        self.what = what

    def describe(self) -> str:
        return self.what


@dataclasses.dataclass
class RayPipes:
    """The kernel's ends of one rank's channels (the names of ``engines.local_group.RankPipes``' kernel ends)."""

    stdout_r: int
    stderr_r: int
    events_r: int
    replies_w: int
    requests_w: int
    control: int

    def fds(self) -> tuple[int, ...]:
        return (self.stdout_r, self.stderr_r, self.events_r, self.replies_w, self.requests_w, self.control)


@dataclasses.dataclass
class RayRank:
    """One rank of a Ray world: the worker the kernel loop and the request engine see."""

    rank: int
    pid: int
    node_id: str
    node_ip: str
    local_rank: int
    node_rank: int
    gpus: list
    actor: object
    pipes: RayPipes
    bundle: int = 0  # its bundle in the world's placement group (a replacement goes into the same one)
    status: ExitStatus | None = None
    here: bool = True  # on the kernel's machine (its node's IP is the kernel's): its pid is one of this /proc

    @property
    def pidfd(self) -> int:
        return self.pipes.control  # readable once the rank's process ended (it never writes on it)

    @property
    def node(self) -> str:
        return f"{self.node_ip} ({self.node_id[:8]})"


class RayRankGroup:
    """The ranks of a Ray world behind the group interface of ``live.world.WorldBase``."""

    def __init__(self, workers: list[RayRank]):
        self.workers = workers
        self.closed = False

    def poll(self, w: RayRank) -> ExitStatus | None:
        """The rank's end, once its control connection says so (without waiting)."""
        if w.status is None and not self.closed:
            ready, _, _ = select.select([w.pipes.control], [], [], 0)
            if ready:
                try:
                    gone = os.read(w.pipes.control, 64) == b""
                except OSError:
                    gone = True
                if gone:
                    what = f"its Ray actor's process ended (on node {w.node}: killed, or the node is gone)"
                    w.status = ActorEnded(what)
        return w.status

    def running(self) -> list[RayRank]:
        return [w for w in self.workers if self.poll(w) is None]

    def signal_all(self, sig: int) -> None:
        """Any stop signal to the whole group: every actor is killed (Ray ends its process, on any node)."""
        import ray

        for w in self.workers:
            if w.status is None:
                try:
                    ray.kill(w.actor, no_restart=True)
                except Exception:  # noqa: BLE001 - already gone: its end shows on its control connection
                    pass

    def drop(self, w: RayRank) -> None:
        """A lost rank let go of: its actor killed (if Ray still has it), its connections closed; it stays listed
        until its replacement takes its place."""
        import ray

        try:
            ray.kill(w.actor, no_restart=True)
        except Exception:  # noqa: BLE001 - gone with its node, or dead already
            pass
        close_quietly(*w.pipes.fds())
        w.pipes = RayPipes(*([-1] * len(w.pipes.fds())))  # (its fd numbers may be reused at once)
        if w.status is None:
            w.status = ActorEnded("let go of as lost")

    def interrupt(self, workers) -> None:
        """■ to these ranks, on their control connections (a Ray actor task cannot be interrupted by Ray)."""
        for w in workers:
            try:
                os.write(w.pipes.control, INTERRUPT)
            except OSError:  # gone: its end shows on the connection
                pass

    def end_requests(self) -> None:
        """Every rank's request channel closed: an idle rank's serve loop ends, and its process with it."""
        for w in self.workers:
            close_quietly(w.pipes.requests_w)

    def wait_ended(self, deadline: float) -> bool:
        """Wait until every rank's process let go of its control connection, or ``deadline`` (monotonic)."""
        while True:
            alive = self.running()
            left = deadline - time.monotonic()
            if not alive or left <= 0:
                return not alive
            select.select([w.pipes.control for w in alive], [], [], left)

    def close_fds(self) -> None:
        self.closed = True
        for w in self.workers:
            close_quietly(*w.pipes.fds())


def accept_ranks(
    listener: socket.socket, token: str, n: int, deadline: float, failed, ranks: set[int] | None = None
) -> dict[int, dict[str, int]]:
    """Accept every rank's connections (rank -> channel -> fd) until ``deadline``; ``failed()`` is checked
    meanwhile and says why a rank will never connect (its actor died), or None. Connections without the world's
    token are closed. On any failure every fd accepted is closed again and a RuntimeError says what is missing.
    ``ranks``: the ranks expected (all ``n`` unless said: replacements of lost ranks); the others are refused."""
    expected = set(range(n)) if ranks is None else set(ranks)
    got: dict[int, dict[str, int]] = {}
    want = len(expected) * len(CHANNELS)
    try:
        while sum(len(c) for c in got.values()) < want:
            why = failed()
            if why is not None:
                raise RuntimeError(why)
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(r for r in expected if len(got.get(r, {})) < len(CHANNELS))
                raise RuntimeError(f"rank(s) {', '.join(map(str, missing))} did not connect back to the kernel in time")
            if not select.select([listener], [], [], min(left, 0.2))[0]:
                continue
            conn, _ = listener.accept()
            intro = _hello(conn, token, n)
            if intro is None or intro[0] not in expected:
                conn.close()
                continue
            rank, channel = intro
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            old = got.setdefault(rank, {}).get(channel)
            if old is not None:
                close_quietly(old)
            got[rank][channel] = conn.detach()
    except BaseException:
        for chans in got.values():
            close_quietly(*chans.values())
        raise
    return got


def _hello(conn: socket.socket, token: str, n: int) -> tuple[int, str] | None:
    """(rank, channel) of a connection that proves it is this world's, else None."""
    conn.settimeout(5.0)
    data = b""
    try:
        while not data.endswith(b"\n") and len(data) < HELLO_MAX:
            chunk = conn.recv(1)  # byte by byte: what the rank writes after its hello is the channel's
            if not chunk:
                return None
            data += chunk
    except OSError:
        return None
    conn.settimeout(None)
    parts = data.decode("ascii", errors="replace").split()
    if len(parts) != 4 or parts[0] != "nblaunch" or not hmac.compare_digest(parts[1], token):
        return None
    if not parts[2].isdigit() or not 0 <= int(parts[2]) < n or parts[3] not in CHANNELS:
        return None
    return int(parts[2]), parts[3]
