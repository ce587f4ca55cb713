"""The Ray world's parts that need no cluster: rank order and the kernel's channel handshake.

(The world itself, on a real multi-node Ray cluster, is tests/test_ray_live.py.)
"""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from kernelside.live.ray_channel import accept_ranks
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
