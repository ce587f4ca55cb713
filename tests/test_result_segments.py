"""Big return values come back through shared memory (kernelside/worker/result_segments.py), with real ranks.

The memory file system is a tmpfs this test mounts (it runs as root, as the suite does) and points nblaunch at
with NBLAUNCH_SHM_DIR, so that a small one (a container's /dev/shm) can be made on purpose and nothing here
touches the machine's /dev/shm.
"""

from __future__ import annotations

import os
import subprocess
import threading

import numpy as np
import pytest
import torch

from kernelside import WorkerError, last_report, notebook_launcher

pytestmark = pytest.mark.processes  # starts ranks


MIB = 1 << 20


@pytest.fixture
def shm(tmp_path, monkeypatch):
    """A tmpfs of 96 MiB mounted for the test (unmounted after it), as nblaunch's memory file system."""
    mount = tmp_path / "shm"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96m,mode=1777", "tmpfs", str(mount)], check=True)
    monkeypatch.setenv("NBLAUNCH_SHM_DIR", str(mount))
    try:
        yield mount
    finally:
        # lazily: tensors the test made may still be mapped from it until they are collected
        subprocess.run(["umount", "--lazy", str(mount)], check=True)


def _left(shm) -> list[str]:
    base = shm / f"nblaunch-{os.getuid()}"
    return sorted(str(p.relative_to(base)) for p in base.rglob("*")) if base.exists() else []


def _mapped_from(path_prefix: str, ptr: int) -> str | None:
    """The file a mapping of this process that holds address ``ptr`` maps, if it is under ``path_prefix``."""
    with open("/proc/self/maps") as fh:
        for line in fh:
            fields = line.split(maxsplit=5)
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if lo <= ptr < hi and len(fields) == 6 and fields[5].startswith(path_prefix):
                return fields[5].strip()
    return None


def model_and_views():
    big = torch.arange(4 * MIB, dtype=torch.int32)  # 16 MiB
    lin = torch.nn.Linear(512, 1024)  # 2 MiB of weight
    return {
        "big": big,
        "view": big[10:20],
        "strided": big.view(1024, 4096)[:, ::2],
        "array": np.arange(2 * MIB, dtype=np.float32),
        "tied": [lin.weight, lin.weight],
        "small": torch.ones(3),
    }


def test_a_big_result_is_mapped_from_shared_memory_with_its_layout_kept(shm):
    v = notebook_launcher(model_and_views, num_processes=2)
    assert v["big"][-1].item() == 4 * MIB - 1 and v["view"].tolist() == list(range(10, 20))
    # views share the storage they shared in the rank; strides as they were
    assert v["view"].untyped_storage().data_ptr() == v["big"].untyped_storage().data_ptr()
    assert v["strided"].stride() == (4096, 2) and v["strided"][1, 1].item() == 4098
    assert v["tied"][0] is v["tied"][1] and isinstance(v["tied"][0], torch.nn.Parameter)
    assert v["tied"][0].requires_grad and v["array"][-1] == 2 * MIB - 1 and v["array"].flags.writeable
    # the kernel's one copy is the mapping of the rank's segment, whose name is already gone
    where = _mapped_from(str(shm), v["big"].data_ptr())
    assert where is not None and where.endswith("(deleted)"), where
    assert _mapped_from(str(shm), v["small"].data_ptr()) is None  # small tensors come in the pickle
    v["big"][0] = 7  # writable, and only ours
    assert v["big"][0].item() == 7
    assert _left(shm) == [] and not last_report().notes


def each_rank_its_own():
    import torch.distributed as dist

    return torch.full((2 * MIB,), dist.get_rank(), dtype=torch.int64)


def test_return_all_brings_each_ranks_value_through_its_own_segment(shm):
    values = notebook_launcher(each_rank_its_own, num_processes=2, return_all=True)
    assert [v.unique().tolist() for v in values] == [[0], [1]]
    assert all(_mapped_from(str(shm), v.data_ptr()) for v in values)
    assert values[0].data_ptr() != values[1].data_ptr() and _left(shm) == []


def too_big_for_shm():
    return torch.ones(48 * MIB // 4, dtype=torch.float32)  # 48 MiB: more than 96 MiB less the 64 MiB margin


def test_a_result_larger_than_the_free_shared_memory_comes_through_the_pipe_with_a_note(shm, capfd):
    v = notebook_launcher(too_big_for_shm, num_processes=2)
    assert v.shape == (12 * MIB,) and v.sum().item() == 12 * MIB
    err = capfd.readouterr().err
    assert "rank 0's return value (48 MiB of it) came through a pipe, not shared memory" in err
    assert "MiB free beyond a 64 MiB margin" in err and "--shm-size" in err
    assert len(last_report().notes) == 1 and _left(shm) == []


def a_big_tensor_and_something_that_cannot_pickle():
    return {"weights": torch.zeros(4 * MIB), "lock": threading.Lock()}


def test_a_result_that_fails_to_pickle_half_way_leaves_no_segment_behind(shm):
    with pytest.raises(WorkerError, match="return value could not be sent back"):
        notebook_launcher(a_big_tensor_and_something_that_cannot_pickle, num_processes=2)
    assert _left(shm) == []


def writes_a_segment_then_dies():
    # a rank that wrote its segment into the launch's folder and died before the kernel took it
    base = os.path.join(os.environ["NBLAUNCH_SHM_DIR"], f"nblaunch-{os.getuid()}")
    (folder,) = [f for f in os.listdir(base) if f.startswith(f"{os.getppid()}-")]
    with open(os.path.join(base, folder, f"rank{os.getpid()}-x.seg"), "wb") as fh:
        fh.write(bytes(2 * MIB))
    os._exit(3)


def test_the_folder_goes_with_the_launch_even_when_a_rank_died_holding_a_segment(shm):
    with pytest.raises(WorkerError, match="rank 0"):
        notebook_launcher(writes_a_segment_then_dies, num_processes=2)
    assert _left(shm) == []


def test_without_a_memory_file_system_results_take_the_pipe(tmp_path, monkeypatch):
    monkeypatch.setenv("NBLAUNCH_SHM_DIR", str(tmp_path / "no such folder"))
    v = notebook_launcher(model_and_views, num_processes=2)
    assert v["big"][-1].item() == 4 * MIB - 1 and v["tied"][0] is v["tied"][1]
    assert not last_report().notes
