"""A live rank inside a Ray actor: the same serve loop as a local live rank (``worker.live_rank``), in the
actor's own process, talking to the kernel over nblaunch's channel instead of Ray's.

The kernel (``live.ray_world``) creates one ``LiveRankActor`` per bundle of its placement group, asks each
``where()`` it is (Ray's node id, its pid, its GPUs: the kernel orders the ranks by them), then calls
``serve()`` once. ``serve()`` never returns while the world lives: it opens one TCP connection to the kernel
per channel (``CHANNELS``, each introduced by ``hello``), moves fds 1 and 2 onto the stdout and stderr
connections (C-level output included; Ray's own log files, and with them its forwarding to the driver and
its deduplication, get nothing from this process), and runs ``serve_requests`` on the events, requests and
replies connections. A Ray actor task cannot be interrupted while it runs (``ray.cancel`` only sets a flag),
so ■ comes on the ``control`` connection: a byte that this process turns into SIGINT to its main thread (where
Ray's worker blocks SIGINT, ``serve()`` unblocks it). The end of the
``control`` connection is the kernel's end: the rank ends with it, whatever it was doing. A rank on another
machine than the kernel's (``report_resources``) sends its own CPU, memory and GPU use on the ``resources``
connection (``worker.own_resources``): the Jupyter server there cannot read this process in its ``/proc``.

Example (the kernel side, see ``live.ray_world``)::

    >>> actor.serve.remote(dataclasses.asdict(spec), ("127.0.0.1", 41234), token)   # doctest: +SKIP
"""

from __future__ import annotations

import builtins
import os
import signal
import socket
import threading

from .. import process_tree
from ..channel import EventWriter
from .lifecycle import RankSpec
from .std_streams import flush_all, fresh_std_streams

CHANNELS = ("stdout", "stderr", "events", "replies", "requests", "control", "resources")
INTERRUPT = b"I"  # on ``control``: SIGINT to this rank
CONNECT_S = 30.0
HELLO_MAX = 128


def hello(token: str, rank: int, channel: str) -> bytes:
    """The first line on each connection: whose world, which rank, which channel (the kernel checks the token).

    Example::

        >>> hello("ab", 3, "events")
        b'nblaunch ab 3 events\\n'
    """
    return f"nblaunch {token} {rank} {channel}\n".encode()


def cuda_index(gpus: list, visible: str | None) -> int | None:
    """The CUDA device index of this rank's GPU (the first Ray gave it) in what this process sees: Ray's masking
    is off (``live.ray_placement``), so that is the node's ``CUDA_VISIBLE_DEVICES`` if set, else every GPU;
    where Ray masked it anyway, its only GPU, 0. None without a GPU.

    Example::

        >>> cuda_index([5], "4,5,6,7"), cuda_index([2], None), cuda_index([2], "2"), cuda_index([], None)
        (1, 2, 0, None)
    """
    if not gpus:
        return None
    first = str(gpus[0])
    seen = [v.strip() for v in visible.split(",")] if visible else None
    if seen is None:
        return int(first) if first.isdigit() else 0
    return seen.index(first) if first in seen else 0


def _watch_control(fd: int) -> None:
    """(a thread) ■ from the kernel becomes this process's SIGINT; the kernel's end ends the rank."""
    while True:
        try:
            data = os.read(fd, 64)
        except InterruptedError:
            continue
        except OSError:
            data = b""
        if not data:
            process_tree.end_descendants()
            os._exit(1)
        if INTERRUPT in data:  # to the main thread itself: a C-level wait there (sleep, a socket) returns EINTR
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)


class LiveRankActor:
    """One live rank of a Ray world (the kernel wraps it with ``ray.remote``)."""

    def where(self) -> dict:
        """Where this actor runs: Ray's node id (several nodes may share one IP), its IP, pid and GPUs."""
        import ray

        ctx = ray.get_runtime_context()
        gpus = [int(g) if str(g).isdigit() else str(g) for g in ray.get_gpu_ids()]
        return {
            "node_id": ctx.get_node_id(),
            "ip": ray.util.get_node_ip_address(),
            "pid": os.getpid(),
            "gpus": gpus,
            "cuda": cuda_index(gpus, os.environ.get("CUDA_VISIBLE_DEVICES")),
        }

    def serve(self, spec: dict, address: tuple[str, int], token: str, report_resources: bool = False) -> int:
        """Connect to the kernel, then serve its requests until it says stop; the process ends with the rank.
        ``report_resources``: this rank is on another machine than the kernel's, so it reports its own figures."""
        from .live_rank import serve_requests
        from .own_resources import report_own_resources

        fds = {}
        for channel in CHANNELS:
            s = socket.create_connection(tuple(address), timeout=CONNECT_S)
            s.settimeout(None)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.sendall(hello(token, spec["rank"], channel))
            fds[channel] = s.detach()
        flush_all()
        os.dup2(fds.pop("stdout"), 1)
        os.dup2(fds.pop("stderr"), 2)
        fresh_std_streams()
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])  # Ray's workers block it; the rank needs ■
        watch = threading.Thread(target=_watch_control, args=(fds["control"],), name="nblaunch-control", daemon=True)
        watch.start()
        if report_resources:
            report_own_resources(fds.pop("resources"), gpu=str(spec.get("device", "")).startswith("cuda"))
        else:
            os.close(fds.pop("resources"))
        # the namespace starts as a cell's exec() would leave it: with builtins (a function rebuilt on globals without
        # them cannot import from C: torch's first tensor in a fresh Ray worker fails on its storage module)
        namespace = {"__builtins__": builtins}
        end = serve_requests(RankSpec(**spec), EventWriter(fds["events"]), fds["requests"], namespace, fds["replies"])
        # as a local rank leaves (worker.entry): no destructor runs (gloo's can deadlock), nothing it started stays
        flush_all()
        process_tree.end_descendants()
        os._exit(end.code)
