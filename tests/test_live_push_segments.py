"""Big values pushed into live ranks, and every rank's value brought back, cross through shared memory.

A real kernel with 2 live ranks, its memory file system a tmpfs of 96 MiB this module mounts (it runs as root, as
the suite does) and points nblaunch at with NBLAUNCH_SHM_DIR: with the 64 MiB margin nblaunch leaves free, 32 MiB
fit, so a value too big for it is made on purpose, and nothing here touches the machine's /dev/shm.
"""

from __future__ import annotations

import os
import subprocess

import pytest

MIB = 1 << 20
MAPPED = (
    "def mapped_from(t):\n"
    "    ptr = t.untyped_storage().data_ptr()\n"
    "    for line in open('/proc/self/maps'):\n"
    "        f = line.split(maxsplit=5)\n"
    "        lo, hi = (int(x, 16) for x in f[0].split('-'))\n"
    "        if lo <= ptr < hi and len(f) == 6:\n"
    "            return f[5].strip()\n"
    "    return None\n"
    "def private_kib(t):\n"  # the memory this process holds of its own in the mapping that holds ``t``
    "    ptr, mine, inside = t.untyped_storage().data_ptr(), 0, False\n"
    "    for line in open('/proc/self/smaps'):\n"
    "        head = line.split()\n"
    "        if '-' in head[0] and not head[0].endswith(':'):\n"
    "            lo, hi = (int(x, 16) for x in head[0].split('-'))\n"
    "            inside = lo <= ptr < hi\n"
    "        elif inside and head[0] in ('Private_Dirty:', 'Anonymous:'):\n"
    "            mine = max(mine, int(head[1]))\n"
    "    return mine"
)


@pytest.fixture(scope="module")
def shm(tmp_path_factory):
    mount = tmp_path_factory.mktemp("shm")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96m,mode=1777", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "--lazy", str(mount)], check=True)


@pytest.fixture(scope="module")
def kernel(kernel_with, shm):
    k = kernel_with("import torch, numpy as np", MAPPED, "%distributed_start -n 2", env={"NBLAUNCH_SHM_DIR": str(shm)})
    k.run(f"%%distributed\n{MAPPED}").ok()
    yield k
    k.run("%distributed_stop")


def _segments(shm) -> list[str]:
    """Segment files under nblaunch's folders of the tmpfs (the session's folder itself stays while it lives)."""
    base = shm / f"nblaunch-{os.getuid()}"
    return sorted(p.name for p in base.rglob("*.seg")) if base.exists() else []


def _out(kernel, code: str) -> str:
    return kernel.run(code).ok().stdout.strip()


def test_a_pushed_tensor_is_mapped_by_every_rank_and_each_ranks_changes_stay_its_own(kernel, shm):
    kernel.run("big = torch.arange(4 * 2**20, dtype=torch.int32)").ok()  # 16 MiB
    kernel.run("%distributed_push big").ok()
    assert _segments(shm) == []  # the kernel took the file away once every rank had it
    cell = kernel.run(
        "%%distributed --return-from all --return where,own,own_after\nimport torch.distributed as dist\n"
        "where = mapped_from(big)\ntotal = int(big.sum())\ndist.barrier()\nown = private_kib(big)\ndist.barrier()\n"
        "big[0] = 100 + rank\nown_after = private_kib(big)"
    ).ok()
    assert cell.error is None
    # read all through by every rank, the value is still the one copy in shared memory: no rank holds a page of it
    # of its own, and a change copies only the page it is on. (The barriers: a page only one rank maps counts as
    # that rank's own, so each rank measures once every rank has read it all, and before any rank has changed it.)
    assert eval(_out(kernel, "print(own)")) == [0, 0], _out(kernel, "print(own, own_after)")
    assert all(0 < kib <= 64 for kib in eval(_out(kernel, "print(own_after)"))), _out(kernel, "print(own_after)")
    where = eval(_out(kernel, "print(where)"))
    assert all(w is not None and w.startswith(str(shm)) and w.endswith("(deleted)") for w in where), where
    kernel.run("%%distributed --return-from all --return first\nfirst = big[0].item()").ok()
    firsts = eval(_out(kernel, "print(first)"))
    assert firsts == [100, 101]  # copy-on-write: rank 1's change is not rank 0's
    assert _out(kernel, "print(big[0].item(), big[-1].item())") == f"0 {4 * MIB - 1}"  # nor the kernel's


def test_a_big_numpy_array_a_cell_uses_crosses_through_shared_memory_once(kernel, shm):
    kernel.run("arr = np.arange(2 * 2**20, dtype=np.float64)").ok()  # 16 MiB, defined after start
    sent = "from kernelside.live.session import current\nn = current().names\nprint(n.names_bytes, n.shared_bytes)"
    total0, shared0 = map(int, _out(kernel, sent).split())
    kernel.run("%%distributed --return-from all --return sums\nsums = float(arr.sum())\narr[:] = rank").ok()
    total1, shared1 = map(int, _out(kernel, sent).split())
    assert shared1 - shared0 == 16 * MIB  # the buffer crossed in the segment, once for every rank
    assert (total1 - shared1) - (total0 - shared0) < MIB  # the pipes carried only the small pickle
    expected = float(sum(range(2 * MIB)))
    assert eval(_out(kernel, "print(sums)")) == [expected, expected]
    assert _out(kernel, "print(arr[-1])") == f"{2 * MIB - 1}.0" and _segments(shm) == []


def test_a_push_bigger_than_the_free_shared_memory_goes_through_the_pipes_and_the_cell_says_so(kernel, shm):
    kernel.run("huge = torch.ones(12 * 2**20)").ok()  # 48 MiB: more than 96 MiB less the 64 MiB margin
    cell = kernel.run("%distributed_push huge").ok()
    assert "huge (48 MiB of it) went to the ranks through their pipes, not shared memory" in cell.stderr
    assert "MiB free beyond a 64 MiB margin" in cell.stderr and "--shm-size" in cell.stderr
    kernel.run("%%distributed --return-from all --return s\ns = huge.sum().item()").ok()
    sums = eval(_out(kernel, "print(s)"))
    assert sums == [12.0 * MIB, 12.0 * MIB] and _segments(shm) == []
    kernel.run("del huge").ok()


def test_a_rank_that_fails_on_a_pushed_value_leaves_no_segment_and_every_rank_keeps_its_state(kernel, shm):
    kernel.run("%%distributed\nkept = rank * 10").ok()
    kernel.run("weights = torch.zeros(3 * 2**20)").ok()  # 12 MiB, new: it crosses with the failing cell
    cell = kernel.run("%%distributed\nassert rank == 0 or weights.sum() > 0, 'rank 1 refuses'")
    assert cell.error is not None and "rank 1 refuses" in "\n".join(cell.error["traceback"])
    assert _segments(shm) == []
    kernel.run("%%distributed --return-from all --return k\nk = kept").ok()
    assert eval(_out(kernel, "print(k)")) == [0, 10]


def test_a_rank_killed_with_a_push_under_way_leaves_no_segment_after_the_restart(kernel, shm):
    kernel.run("state = torch.ones(4 * 2**20)").ok()  # 16 MiB
    cell = kernel.run("%%distributed\nimport os\nif rank == 1:\n    os._exit(9)\nstate.sum()")
    assert cell.error is not None
    assert "the live session was restarted: its state is gone" in "\n".join(cell.error["traceback"])
    assert _segments(shm) == []
    kernel.run(f"%%distributed\n{MAPPED}").ok()  # (the new ranks lack what the old ones defined)


def test_return_from_all_brings_each_live_ranks_value_through_its_own_segment(kernel, shm):
    kernel.run(
        "%%distributed --return-from all --return mine\nmine = torch.full((2 * 2**20,), rank, dtype=torch.int64)"
    ).ok()
    assert _out(kernel, "print([v.unique().tolist() for v in mine])") == "[[0], [1]]"
    where = eval(_out(kernel, "print([mapped_from(v) for v in mine])"))
    assert all(w is not None and w.startswith(str(shm)) and w.endswith("(deleted)") for w in where), where
    assert _out(kernel, "print(mine[0].data_ptr() != mine[1].data_ptr())") == "True" and _segments(shm) == []
