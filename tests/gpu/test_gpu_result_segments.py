"""A CUDA tensor a rank returns comes back through shared memory, and the launching process never touches CUDA.

One GPU is enough: the rank makes the tensor on its GPU, moves it to CPU as every result is, and writes its
storage into the launch's segment; the kernel (this test process) maps it.
"""

from __future__ import annotations

import pytest

from kernelside import last_report, notebook_launcher
from kernelside.launch import cuda_guard

pytestmark = pytest.mark.usefixtures("gpu_left_clean", "no_leaks")

MIB = 1 << 20


def a_cuda_tensor():
    import torch

    return {"on_gpu": torch.arange(8 * MIB, dtype=torch.int32, device="cuda"), "small": torch.ones(3, device="cuda")}


def _mapped_from_shm(ptr: int) -> str | None:
    with open("/proc/self/maps") as fh:
        for line in fh:
            fields = line.split(maxsplit=5)
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if lo <= ptr < hi and len(fields) == 6 and "nblaunch-" in fields[5]:
                return fields[5].strip()
    return None


def test_a_cuda_result_comes_back_on_cpu_through_shared_memory_without_cuda_here():
    v = notebook_launcher(a_cuda_tensor, num_processes=1)
    assert v["on_gpu"].device.type == "cpu" and v["on_gpu"][-1].item() == 8 * MIB - 1
    where = _mapped_from_shm(v["on_gpu"].untyped_storage().data_ptr())
    assert where is not None and where.endswith("(deleted)"), where
    assert v["small"].tolist() == [1.0, 1.0, 1.0] and not last_report().notes
    assert not cuda_guard.is_cuda_initialized()  # the launching process (a kernel) never made a CUDA context
