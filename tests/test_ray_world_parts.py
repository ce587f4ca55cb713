"""The Ray world's parts that need no cluster: rank order and the kernel's channel handshake.

(The world itself, on a real multi-node Ray cluster, is tests/test_ray_live.py.)
"""

from __future__ import annotations

import os
import socket
import threading
import time
from types import SimpleNamespace

import pytest

from kernelside.live.ray_channel import accept_ranks
from kernelside.live.ray_losses import by_node, lost_line, slot_on
from kernelside.live.ray_world import _order
from kernelside.worker.ray_live_rank import CHANNELS, hello


def test_ranks_are_ordered_by_node_kernels_node_first_then_by_gpu_with_local_ranks_per_node_id():
    where = [  # bundle order, as Ray placed them; nodes "b" and "c" share an IP, which must not matter
        {"node_id": "b", "gpus": [3]},
        {"node_id": "c", "gpus": [0]},
        {"node_id": "b", "gpus": [1]},
        {"node_id": "k", "gpus": [5]},
        {"node_id": "c", "gpus": [1]},
    ]
    order = _order(where, kernel_node="k")
    # (actor index, local rank, node rank, ranks on its node)
    assert order == [(3, 0, 0, 1), (2, 0, 1, 2), (0, 1, 1, 2), (1, 0, 2, 2), (4, 1, 2, 2)]


def test_ranks_without_gpus_keep_bundle_order_within_a_node():
    where = [{"node_id": "a", "gpus": []}, {"node_id": "b", "gpus": []}, {"node_id": "a", "gpus": []}]
    assert [i for i, *_ in _order(where, kernel_node="x")] == [0, 2, 1]


def _connect(port: int, token: str, rank: int, channels=CHANNELS, extra: bytes = b"") -> list[socket.socket]:
    out = []
    for c in channels:
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(hello(token, rank, c) + extra)
        out.append(s)
    return out


def test_the_kernel_keeps_only_connections_with_its_worlds_token_and_the_bytes_after_the_hello():
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    kept = []

    def ranks():
        kept.extend(_connect(port, "f" * 32, 0))  # a stranger: another token
        kept.extend(_connect(port, "a" * 32, 0, extra=b"first bytes"))
        kept.extend(_connect(port, "a" * 32, 1))

    t = threading.Thread(target=ranks)
    t.start()
    got = accept_ranks(listener, "a" * 32, 2, time.monotonic() + 30, lambda: None)
    t.join()
    listener.close()
    try:
        assert sorted(got) == [0, 1] and all(sorted(got[r]) == sorted(CHANNELS) for r in got)
        os.set_blocking(got[0]["stdout"], True)
        assert os.read(got[0]["stdout"], 100) == b"first bytes"  # what the rank wrote after its hello is its own
    finally:
        for chans in got.values():
            for fd in chans.values():
                os.close(fd)
        for s in kept:
            s.close()


def test_a_rank_that_never_connects_fails_the_start_by_the_deadline_naming_it():
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    socks = _connect(port, "a" * 32, 0)
    try:
        with pytest.raises(RuntimeError, match=r"rank\(s\) 1 did not connect back to the kernel in time"):
            accept_ranks(listener, "a" * 32, 2, time.monotonic() + 1.0, lambda: None)
        with pytest.raises(RuntimeError, match="actor died"):
            accept_ranks(listener, "a" * 32, 2, time.monotonic() + 30, lambda: "actor died")
    finally:
        listener.close()
        for s in socks:
            s.close()


def test_a_replacement_connection_is_accepted_only_for_the_lost_ranks():
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    socks = _connect(port, "a" * 32, 1) + _connect(port, "a" * 32, 3)  # rank 1 stayed: not to be taken again
    try:
        got = accept_ranks(listener, "a" * 32, 4, time.monotonic() + 30, lambda: None, ranks={3})
        assert sorted(got) == [3] and sorted(got[3]) == sorted(CHANNELS)
        for fd in got[3].values():
            os.close(fd)
    finally:
        listener.close()
        for s in socks:
            s.close()


def _rank(rank, node_id, local_rank=0, node_rank=0, pid=None):
    return SimpleNamespace(
        rank=rank,
        node_id=node_id,
        local_rank=local_rank,
        node_rank=node_rank,
        pid=pid or 100 + rank,
        node=f"127.0.0.1 ({node_id})",
    )


def test_a_replacement_takes_the_free_local_rank_on_its_node_and_a_new_node_the_free_node_rank():
    stayed = [_rank(0, "a", 0, 0), _rank(1, "a", 1, 0), _rank(3, "b", 1, 1)]
    assert slot_on("b", stayed) == (0, 1, 2)  # rank 2's process killed: back on its node as local rank 0
    assert slot_on("a", stayed[:1]) == (1, 0, 2)
    # node b removed (ranks 2, 3): both go to node c, which takes node rank 1, the one b left
    first = slot_on("c", stayed[:2])
    assert first == (0, 1, 1)
    assert slot_on("c", [*stayed[:2], _rank(2, "c", first[0], first[1])]) == (1, 1, 2)


def test_lost_ranks_are_said_by_node_and_whether_the_node_left_the_cluster():
    lost = [_rank(3, "b", pid=13), _rank(2, "b", pid=12), _rank(0, "a", pid=10)]
    assert [[w.rank for w in ws] for ws in by_node(lost)] == [[0], [2, 3]]
    assert lost_line(by_node(lost)[1], node_left=True) == (
        "ranks 2, 3 (pids 12, 13) were lost with node 127.0.0.1 (b), which left the Ray cluster"
    )
    assert lost_line(by_node(lost)[0], node_left=False) == (
        "rank 0 (pid 10) was lost on node 127.0.0.1 (a): the process ended (killed? out of memory?), the node is "
        "still up"
    )
