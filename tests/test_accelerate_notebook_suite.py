"""Accelerate's own notebook tests, run against nblaunch's notebook_launcher in place of Accelerate's.

``accelerate/test_utils/scripts/test_notebook.py`` (shipped with accelerate) is what Accelerate
checks its launcher with: PartialState in the ranks, both rendezvous backends, max_restarts,
and a failing rank stopping a sleeping one (caught as torch's ChildFailedError). Its bitsandbytes
test needs bitsandbytes, which is not installed here, so it is not among the cases.

Below, Accelerate's shipped distributed test scripts run three ways on 2 CPU ranks: under torchrun (what
`accelerate launch` runs them with), through `notebook_launcher`, and in a `%%distributed -n 2` cell; every test's
outcome under nblaunch must be torchrun's.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time

import accelerate
import psutil
import pytest
from reference_scripts import LEAVE

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

pytestmark = pytest.mark.processes  # every test here launches ranks (torchrun, notebook_launcher)


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


# -- Accelerate's distributed test scripts: torchrun, notebook_launcher and %%distributed side by side ----------------

SCRIPTS = os.path.join(os.path.dirname(accelerate.__file__), "test_utils", "scripts")
# test_distributed_data_loop's CPU part: its tests that take no argument, but test_can_join_uneven_inputs, which
# needs GPUs. Evidence, torchrun --nproc-per-node 2 on this CPU machine with ACCELERATE_USE_CPU=True: Accelerate warns
# "Joining uneven inputs is only supported for multi-GPU training", rank 0 runs a second backward that rank 1 never
# joins, and both ranks wait in DDP's all-reduce until killed (> 90 s).
DATA_LOOP_CPU_PART = [
    "test_default_ensures_even_batch_sizes",
    "test_can_disable_even_batches",
    "test_join_can_override_even_batches",
    "test_join_can_override_for_mixed_type_dataloaders",
    "test_join_raises_warning_for_iterable_when_overriding_even_batches",
    "test_pickle_accelerator",
]
# what runs, the same under each launcher: the script's own main(), or the named tests of its module in order
PEER_SCRIPTS = {
    "test_ops": ["main"],
    "test_sync": ["main"],
    "test_cli": ["main"],
    "test_script": ["main"],
    "test_distributed_data_loop": DATA_LOOP_CPU_PART,
}
# Tests that fail on CPU under torchrun itself, with the same error under nblaunch (asserted from torchrun's run
# below, never skipped): Accelerate's join_uneven_inputs() returns at once outside multi-GPU training, so the
# even_batches it should override stays as it was and these tests' asserts fail on both ranks.
FAILS_ON_CPU_UNDER_TORCHRUN = {
    "test_join_can_override_even_batches": "AssertionError",
    "test_join_can_override_for_mixed_type_dataloaders": "AssertionError",
    "test_join_raises_warning_for_iterable_when_overriding_even_batches": "AssertionError",
}
RUNNER = """
import importlib.util, os
_spec = importlib.util.spec_from_file_location({name!r}, {path!r})
_suite = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_suite)
for _test in {tests!r}:
    try:
        getattr(_suite, _test)()
        _outcome = "passed"
    except Exception as _e:
        _outcome = type(_e).__name__
    if os.environ["RANK"] == "0":
        print("OUTCOME", _test, _outcome, flush=True)
"""


def runner(name: str) -> str:
    return RUNNER.format(name=name, path=os.path.join(SCRIPTS, f"{name}.py"), tests=PEER_SCRIPTS[name])


def run_peer_script(name: str) -> None:
    exec(runner(name), {"__name__": "__peer__"})


def _outcomes(text: str) -> dict[str, str]:
    return dict(line.split()[1:3] for line in text.splitlines() if line.startswith("OUTCOME "))


def expected_under_torchrun(name: str) -> dict[str, str]:
    return {t: FAILS_ON_CPU_UNDER_TORCHRUN.get(t, "passed") for t in PEER_SCRIPTS[name]}


@pytest.fixture(scope="module")
def torchrun_results(tmp_path_factory):
    """Each script under torchrun, all at once (the suite's time): (returncode, rank 0's outcome of each test,
    seconds, output)."""
    root = tmp_path_factory.mktemp("peer_scripts")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELERATE_")}
    env.update(ACCELERATE_USE_CPU="True", OMP_NUM_THREADS="1")  # what accelerate launch exports for MULTI_CPU
    runs = {}
    for name in PEER_SCRIPTS:
        (root / f"{name}_runner.py").write_text(runner(name) + LEAVE)  # (reference_scripts.py)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
               "--rdzv-endpoint", f"127.0.0.1:{port}", f"{name}_runner.py"]  # fmt: skip
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        runs[name] = (proc, time.monotonic())
    results = {}
    for name, (proc, t0) in runs.items():
        out, err = proc.communicate(timeout=300)
        results[name] = (proc.returncode, _outcomes(out), time.monotonic() - t0, out + err)
    return results


@pytest.mark.parametrize("name", list(PEER_SCRIPTS))
def test_accelerates_distributed_script_passes_under_notebook_launcher_as_under_torchrun(
    name, torchrun_results, capfd, monkeypatch
):
    for k in [k for k in os.environ if k.startswith("ACCELERATE_")]:
        monkeypatch.delenv(k)
    rc, under_torchrun, seconds, output = torchrun_results[name]
    assert rc == 0 and under_torchrun == expected_under_torchrun(name), output[-3000:]
    t0 = time.monotonic()
    kernelside.notebook_launcher(run_peer_script, args=(name,), num_processes=2)
    took = time.monotonic() - t0
    assert _outcomes(capfd.readouterr().out) == under_torchrun
    print(f"{name}: torchrun {seconds:.1f} s, notebook_launcher {took:.1f} s")


@pytest.fixture(scope="module")
def kernel(kernel_with, tmp_path_factory):
    return kernel_with(cwd=tmp_path_factory.mktemp("peer_cell"))


@pytest.mark.parametrize("name", list(PEER_SCRIPTS))
def test_accelerates_distributed_script_passes_in_a_distributed_cell_as_under_torchrun(name, torchrun_results, kernel):
    rc, under_torchrun, seconds, output = torchrun_results[name]
    assert rc == 0 and under_torchrun == expected_under_torchrun(name), output[-3000:]
    t0 = time.monotonic()
    cell = kernel.run(f"%%distributed -n 2\n{runner(name)}", timeout=300).ok()
    took = time.monotonic() - t0
    assert _outcomes(cell.stdout) == under_torchrun
    print(f"{name}: torchrun {seconds:.1f} s, %%distributed {took:.1f} s")
