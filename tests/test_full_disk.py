"""A full disk costs no run (issue 28): the run folders on a small tmpfs the test mounts (and unmounts), filled
up. Rank 0 printing 5 MB: every line still reaches the cell (within its budget), the cell says once that the
disk is full and where, the cell ends on its own with no rank left running, and the kernel runs the next cell;
after space is freed a launch works as ever. Before, the kernel's loop raised a bare
``OSError: [Errno 28] No space left on device`` and left both ranks running."""

from __future__ import annotations

import os
import subprocess

import psutil
import pytest
from kernel import Kernel

pytestmark = pytest.mark.kernel  # starts kernels


PRINT_5MB = (
    "%%distributed -n 2\nif rank == 0:\n    for i in range(50_000):\n        print(f'line {i:06d} ' + 'x' * 90)\n"
    "print('end', rank)"
)

STATE = (
    "%%distributed\nimport torch.distributed as dist\nseen = [None] * world_size\n"
    "dist.all_gather_object(seen, (rank, kept, pid))\nprint('state', seen)"
)


@pytest.fixture
def small_disk(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(mnt) -> None:
    """Fill the filesystem up (a file as large as it lets one be, to the last byte)."""
    with open(mnt / "filler", "ab", buffering=0) as f:
        for size in (65536, 4096, 1):
            try:
                while True:
                    f.write(b"\0" * size)
            except OSError:
                pass


def test_a_full_disk_under_the_run_folders_ends_the_cell_with_one_clear_message_and_the_kernel_goes_on(
    small_disk, tmp_path
):
    k = Kernel(cwd=str(tmp_path), env={"TMPDIR": str(small_disk)})
    try:
        k.run("%load_ext kernelside").ok()
        k.run("%%distributed -n 2\nprint('warm', rank)").ok()  # the run-folder base exists: then the disk fills
        _fill(small_disk)
        cell = k.run(PRINT_5MB, timeout=300)
        assert cell.error is None, "\n".join(cell.error["traceback"])
        assert "line 000000" in cell.stdout and "end 0" in cell.stdout
        notes = [line for line in cell.stderr.splitlines() if "could not be written" in line]
        assert len(notes) == 1 and f"the disk holding {small_disk}" in notes[0], cell.stderr
        alive = [p for p in psutil.Process(k.pid).children(recursive=True) if "forkserver" not in " ".join(p.cmdline())]
        assert alive == [], f"left running after the cell: {alive}"
        assert "ok 2" in k.run("print('ok', 1 + 1)").ok().stdout
        os.unlink(small_disk / "filler")
        assert "again 0" in k.run("%%distributed -n 2\nprint('again', rank)").ok().stdout
    finally:
        k.shutdown()


def test_a_full_disk_in_a_live_session_keeps_every_ranks_state_and_names_the_disk(small_disk, tmp_path):
    k = Kernel(cwd=str(tmp_path), env={"TMPDIR": str(small_disk)})
    try:
        k.run("%load_ext kernelside").ok()
        k.run("%distributed_start -n 2", timeout=300).ok()
        k.run("%%distributed\nkept = rank * 10\nimport os\npid = os.getpid()").ok()
        before = k.run(STATE).ok().stdout
        _fill(small_disk)
        cell = k.run(PRINT_5MB.replace("%%distributed -n 2", "%%distributed"), timeout=300)
        assert cell.error is None, "\n".join(cell.error["traceback"])
        assert "end 0" in cell.stdout and "out of memory" not in cell.stdout + cell.stderr
        assert sum("could not be written" in line for line in cell.stderr.splitlines()) == 1, cell.stderr
        after = k.run(STATE).ok().stdout
        # every rank's value is still there, in the same rank processes (no restart)
        assert sorted(line for line in after.splitlines() if "state" in line) == sorted(
            line for line in before.splitlines() if "state" in line
        ), (before, after)
        assert "(1, 10, " in after
        os.unlink(small_disk / "filler")
        k.run("%distributed_stop", timeout=120).ok()
    finally:
        k.shutdown()
