"""The GPU test kit on a machine without a GPU: it refuses at once and clearly, and never reports a pass.

``make test-gpu``, ``pytest tests/gpu`` and ``tests/gpu/on_device.sh`` each stop with the one line
below and a non-zero exit; the on-device script still writes its summary saying so; and the normal
``pytest tests`` run does not collect tests/gpu at all (no skip to count).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from kernelside.launch.hardware import gpu_count

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NO_CUDA = "no CUDA device: make test-gpu needs a machine with a GPU"

pytestmark = [
    pytest.mark.skipif(
        gpu_count() > 0,
        reason="this machine has a CUDA GPU: the refusal cannot be shown here (make test-gpu runs the kit instead)",
    ),
    pytest.mark.processes,  # every test here runs make or pytest
]


def _env() -> dict:
    # not the outer make's level and flags (under `make test` this runs inside a make): a make of its own
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS", "MAKEOVERRIDES")}
    return {**env, "PYTHONPATH": REPO}


@pytest.mark.parametrize("python", ["the venv's", "GPU_PY"])
def test_make_test_gpu_stops_at_once_with_one_clear_line_and_a_failing_exit(python):
    extra = [f"GPU_PY={sys.executable}"] if python == "GPU_PY" else []
    t0 = time.monotonic()
    run = subprocess.run(
        ["make", "--no-print-directory", "test-gpu", *extra],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    )
    assert run.returncode != 0
    lines = run.stderr.splitlines()
    assert lines[0] == NO_CUDA, run.stderr
    assert all(line.startswith("make: ***") for line in lines[1:]), run.stderr  # make's own "Error 1" line
    assert "pytest" not in run.stdout and "passed" not in run.stdout  # nothing ran, nothing was installed
    assert time.monotonic() - t0 < 10, "the refusal came only after other work"


def test_pytest_on_tests_gpu_refuses_before_collecting_anything():
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/gpu", "-p", "no:cacheprovider", "-q"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    )
    assert run.returncode == 1
    assert f"Exit: {NO_CUDA}" in run.stderr, run.stderr
    assert "passed" not in run.stdout and "skipped" not in run.stdout


def test_root_pytest_run_does_not_collect_the_gpu_tests():
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "tests", "-p", "no:cacheprovider"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=_env(),
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    collected = [line for line in run.stdout.splitlines() if "::" in line]
    assert any(line.startswith("tests/test_gpu_kit.py::") for line in collected)
    assert not [line for line in collected if line.startswith("tests/gpu/")]
    assert NO_CUDA not in run.stdout + run.stderr  # tests/gpu/conftest.py was not even loaded


def test_on_device_script_refuses_and_still_writes_a_summary_saying_so(tmp_path):
    out = tmp_path / "out"
    run = subprocess.run(
        ["bash", "tests/gpu/on_device.sh", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**_env(), "PY": sys.executable},
    )
    assert run.returncode == 1
    assert run.stderr.splitlines() == [NO_CUDA]
    summary = (out / "summary.md").read_text()
    assert f"**{NO_CUDA}**" in summary and "Nothing was run: no test, no benchmark." in summary
    assert sorted(p.name for p in out.iterdir()) == ["summary.md"]  # no junit, no log: nothing ran


def test_every_gpu_test_module_imports_and_collects_without_a_gpu():
    """The kit cannot run here, but a GPU test that fails to import (a helper renamed on main, a syntax error)
    would cost a GPU machine's time: without the refusing conftest, every module must collect cleanly."""
    gpu_dir = os.path.join(REPO, "tests", "gpu")
    env = {**_env(), "PYTHONPATH": os.pathsep.join((REPO, gpu_dir, os.path.dirname(gpu_dir)))}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/gpu", "--collect-only", "-q", "--noconftest", "-p", "no:cacheprovider"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    modules = {line.split("::")[0] for line in run.stdout.splitlines() if "::" in line}
    expected = {f"tests/gpu/{f}" for f in os.listdir(gpu_dir) if f.startswith("test_") and f.endswith(".py")}
    assert modules == expected and len(expected) >= 6


GPU_BENCHES = ("bench.gpu_launch", "bench.gpu_steady", "bench.gpu_ranks")


@pytest.mark.parametrize("module", GPU_BENCHES)
def test_every_gpu_benchmark_imports_without_a_gpu(module):
    """A GPU bench that fails to import would cost the GPU machine's time: each one imports here."""
    run = subprocess.run(
        [sys.executable, "-c", f"import {module}"], cwd=REPO, capture_output=True, text=True, timeout=120, env=_env()
    )
    assert run.returncode == 0, run.stderr[-3000:]


def test_the_issue_34_gpu_benchmark_refuses_at_once_with_one_line_and_writes_nothing(tmp_path):
    results = os.path.join(REPO, "bench", "results", "gpu_ranks.md")
    before = os.path.getmtime(results) if os.path.exists(results) else None
    t0 = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", "bench.gpu_ranks", "--quick"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    )
    assert run.returncode == 1 and run.stdout == ""
    assert run.stderr.splitlines() == [
        "no CUDA device: bench.gpu_ranks needs a GPU (bench.launch_ranks, live_ranks and results_path run without)"
    ]
    assert time.monotonic() - t0 < 60, "the refusal came only after other work"
    after = os.path.getmtime(results) if os.path.exists(results) else None
    assert after == before  # no figures written
