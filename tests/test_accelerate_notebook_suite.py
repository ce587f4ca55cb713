"""Accelerate's own notebook tests, run against nblaunch's notebook_launcher in place of Accelerate's.

``accelerate/test_utils/scripts/test_notebook.py`` (shipped with accelerate) is what Accelerate
checks its launcher with: PartialState in the ranks, both rendezvous backends, max_restarts,
and a failing rank stopping a sleeping one (caught as torch's ChildFailedError). Its bitsandbytes
test needs bitsandbytes, which is not installed here, so it is not among the cases.
"""

from __future__ import annotations

import importlib.util
import os

import accelerate
import psutil
import pytest

import kernelside

SUITE = os.path.join(os.path.dirname(accelerate.__file__), "test_utils", "scripts", "test_notebook.py")
CASES = [
    "test_can_initialize",
    "test_clean_cuda_fork",
    "test_static_rdzv_backend",
    "test_c10d_rdzv_backend",
    "test_fault_tolerant",
    "test_monitoring",
]


@pytest.fixture(scope="module")
def suite():
    """Accelerate's test module, loaded with nblaunch's launcher where it imports Accelerate's."""
    saved = os.environ.get("ACCELERATE_NUM_PROCESSES")
    os.environ["ACCELERATE_NUM_PROCESSES"] = "2"  # read when the module is loaded
    original = accelerate.notebook_launcher
    accelerate.notebook_launcher = kernelside.notebook_launcher
    try:
        spec = importlib.util.spec_from_file_location("accelerate_test_notebook", SUITE)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        accelerate.notebook_launcher = original
        if saved is None:
            os.environ.pop("ACCELERATE_NUM_PROCESSES")
        else:
            os.environ["ACCELERATE_NUM_PROCESSES"] = saved
    assert module.notebook_launcher is kernelside.notebook_launcher and module.NUM_PROCESSES == 2
    return module


@pytest.mark.parametrize("case", CASES)
def test_accelerates_own_notebook_test_passes_with_nblaunch(suite, case, request):
    if case != "test_fault_tolerant":  # that case makes a multiprocessing Queue of its own: its pipe is not ours
        request.getfixturevalue("no_leaks")
    getattr(suite, case)()
    alive = [c for c in psutil.Process().children(recursive=True) if c.status() != psutil.STATUS_ZOMBIE]
    assert alive == [], f"processes left behind: {alive}"
