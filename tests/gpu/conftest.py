"""The GPU kit's fixtures. These tests need CUDA and refuse to run without it: never a skip counted as a pass.

Run them with ``make test-gpu``, or ``bash tests/gpu/on_device.sh OUT`` on a GPU machine without
network. ``pytest tests`` never collects this folder (tests/conftest.py ignores it unless named).

The test process stands for the notebook's kernel and never initializes CUDA itself: forked ranks
need a kernel without a CUDA context, and several tests check exactly that it stays so. GPU facts
come from NVML here (torch's device count reads NVML too); scenarios that must initialize CUDA in
the launching process run in a process of their own (``gpu_scenario.run_scenario``).
"""

from __future__ import annotations

import os
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # require_cuda, gpu_scenario; tests/kernel.py

from gpu_facts import text, used_bytes, wait_gpu_released  # noqa: E402
from require_cuda import NO_CUDA  # noqa: E402


def _gpu_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    if not torch.backends.cuda.is_built():
        return 0
    return torch.cuda.device_count()  # through NVML: CUDA stays uninitialized in this process


STARTED = time.monotonic()  # when pytest loaded the kit: GPU_TESTS_BUDGET_S counts from here


def pytest_sessionstart(session):
    if _gpu_count() == 0:
        pytest.exit(NO_CUDA, returncode=1)  # before any test module is imported or collected


def pytest_runtest_setup(item):
    """Past GPU_TESTS_BUDGET_S (set by on_device.sh below its hard cap), the tests left are skipped, said as such:
    pytest then ends in time to write junit.xml, instead of being killed with every outcome lost."""
    budget = os.environ.get("GPU_TESTS_BUDGET_S")
    if budget and time.monotonic() - STARTED > float(budget):
        pytest.skip(f"not run: the {budget} s this run gave the GPU tests were spent (a skip is not a pass)")


@pytest.fixture(scope="session")
def gpus() -> int:
    """How many GPUs the launching process sees."""
    return _gpu_count()


@pytest.fixture(scope="session")
def nvml():
    import pynvml

    pynvml.nvmlInit()
    return pynvml


@pytest.fixture(scope="session")
def visible(nvml, gpus):
    """For each of the launching process's CUDA devices, in order: (CUDA_VISIBLE_DEVICES entry, NVML handle, UUID)."""
    from kernelside.launch.gpu_usage import visible_nvml_indices

    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
    uuids = [text(nvml.nvmlDeviceGetUUID(h)) for h in handles]
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    entries = [e.strip() for e in cvd.split(",")] if cvd is not None else [str(i) for i in range(len(handles))]
    order = visible_nvml_indices(cvd, uuids)
    assert len(order) == gpus, f"NVML maps CUDA_VISIBLE_DEVICES={cvd!r} to {order}, torch counts {gpus} GPU(s)"
    return [(entries[k], handles[i], uuids[i]) for k, i in enumerate(order)]


@pytest.fixture
def gpu_left_clean(nvml, visible):
    """After the test: the launching process has not initialized CUDA, and the GPUs hold nothing of the test's."""
    from kernelside import last_report
    from kernelside.launch import cuda_guard

    handles = [h for _, h, _ in visible]
    baseline = used_bytes(nvml, handles)
    before = last_report()
    yield
    rep = last_report()
    pids = {r.pid for r in rep.ranks} if rep is not None and rep is not before else set()
    released, held = wait_gpu_released(nvml, handles, baseline, pids, within=10.0)
    assert released, held
    assert not cuda_guard.is_cuda_initialized(), (
        f"CUDA got initialized in the launching process ({cuda_guard.first_init_site()}): later fork launches break"
    )
