"""The test harness itself (tests/conftest.py): a test that asks for a kernel fixture, however indirectly, is
marked ``kernel``, and one that asks for a launch (``no_leaks``) or ``starts_processes`` is marked ``processes``
like every kernel test, so ``make test-fast`` (``-m "not processes and not server"``) leaves them out; a test
that starts a kernel without the mark fails with the reason, whichever way it starts one. Each case runs the real
conftest in a pytest of its own."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.processes  # each case runs a pytest of its own

TESTS = Path(__file__).resolve().parent

ASKS_FOR_KERNELS = """
import pytest

@pytest.fixture(scope="module")
def kernel(kernel_with):
    return kernel_with("import time")

@pytest.fixture
def driver_run(starts_kernels):
    return None

@pytest.fixture
def server(starts_processes):
    return None

@pytest.fixture
def jp_serverapp():  # pytest-jupyter's fixture of that name, which jp_fetch asks for
    return None

def test_with_the_modules_kernel(kernel):
    pass

def test_with_a_kernel_of_its_own(new_kernel):
    pass

def test_with_a_driver_that_starts_kernels(driver_run):
    pass

def test_with_a_launch(no_leaks):
    pass

def test_with_a_server(server):
    pass

def test_with_a_route(jp_serverapp):
    pass

def test_without_a_kernel():
    pass
"""

STARTS_KERNELS_UNMARKED = """
import subprocess, sys

def test_by_hand():
    from kernel import Kernel
    Kernel()

def test_through_nbclient():
    import nbformat
    from nbclient import NotebookClient
    NotebookClient(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1")])).execute()

def test_in_a_driver_script():
    driver = subprocess.run([sys.executable, "-c", "from kernel import Kernel; Kernel()"], capture_output=True)
    assert driver.returncode == 0, driver.stderr.decode()
"""

REFUSAL = "starts a kernel but is not marked 'kernel', so `make test-fast` would run it"


@pytest.fixture
def suite(pytester, monkeypatch):
    """A pytest of its own with the real tests/conftest.py (its imports from tests/ on the path)."""
    monkeypatch.setenv("PYTHONPATH", f"{TESTS}:{TESTS.parent}")
    monkeypatch.delenv("NBLAUNCH_TEST_NOT_MARKED_KERNEL", raising=False)  # this test's own, set by the conftest
    pytester.makeconftest((TESTS / "conftest.py").read_text())
    marks = "".join(f"\n    {mark}: {mark}" for mark in ("kernel", "processes", "server"))
    pytester.makeini(f"[pytest]\naddopts = --strict-markers\nmarkers ={marks}\n")
    return pytester


def _collected(result) -> list[str]:
    return sorted(line.split("::")[1] for line in result.outlines if "::" in line)


def test_every_test_asking_for_a_kernel_or_a_process_fixture_is_marked_and_left_out_of_the_fast_layer(suite):
    suite.makepyfile(test_layers=ASKS_FOR_KERNELS)
    fast = suite.runpytest_subprocess("--collect-only", "-q", "-m", "not processes and not server")
    assert _collected(fast) == ["test_without_a_kernel"], fast.outlines
    kernel = ["test_with_a_driver_that_starts_kernels", "test_with_a_kernel_of_its_own", "test_with_the_modules_kernel"]
    marked = suite.runpytest_subprocess("--collect-only", "-q", "-m", "kernel")
    assert _collected(marked) == kernel, marked.outlines
    marked = suite.runpytest_subprocess("--collect-only", "-q", "-m", "processes")
    assert _collected(marked) == sorted([*kernel, "test_with_a_launch", "test_with_a_server"]), marked.outlines
    marked = suite.runpytest_subprocess("--collect-only", "-q", "-m", "server")
    assert _collected(marked) == ["test_with_a_route"], marked.outlines


def test_a_test_that_starts_a_kernel_without_the_mark_fails_with_the_reason_in_process_or_in_a_driver(suite):
    suite.makepyfile(test_unmarked=STARTS_KERNELS_UNMARKED)
    result = suite.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=3)
    text = "\n".join(result.outlines)
    for test in ("test_by_hand", "test_through_nbclient", "test_in_a_driver_script"):
        assert f"test_unmarked.py::{test} {REFUSAL}" in text, text


def test_a_new_kernel_test_is_three_lines(kernel, request):
    cell = kernel.run("%%distributed -n 2\nworld_size").ok()
    assert cell.result["text/plain"] == "2"
    assert request.node.get_closest_marker("kernel") is not None  # set by its fixture, not written here
