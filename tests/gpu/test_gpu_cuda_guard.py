"""CUDA already initialized in the launching process: by torch (a tensor on cuda), or below torch (the driver's
cuInit through ctypes, or torch.cuda.is_available()). nblaunch must use the forkserver (ranks forked from a clean
template process, never from the kernel), say why and where, refuse fork
clearly, and keep fork when the driver is merely loaded. Each scenario is a fresh "notebook" process.
"""

from __future__ import annotations

import pytest
from gpu_scenario import line_of, run_scenario

from kernelside.launch import cuda_guard

pytestmark = pytest.mark.usefixtures("gpu_left_clean", "no_leaks")  # NVML is up before the fd census

RANK_DEVICE = """
def rank_device():
    import torch
    import torch.distributed as dist

    t = torch.ones(1, device="cuda")
    dist.all_reduce(t)
    return {"backend": dist.get_backend(), "device": torch.cuda.current_device(), "sum": t.item()}
"""

TORCH_FIRST = (
    """import json
import torch
from kernelside import LaunchConfigError, last_report, notebook_launcher
"""
    + RANK_DEVICE
    + """
n = torch.cuda.device_count()
x = torch.ones(1, device="cuda")  # CUDA is first initialized here
value = notebook_launcher(rank_device, num_processes=n)
method = last_report().start_method
try:
    notebook_launcher(rank_device, num_processes=n, start_method="fork")
    fork_error = None
except LaunchConfigError as e:
    fork_error = str(e)
print("RESULT " + json.dumps({"n": n, "value": value, "method": method, "fork_error": fork_error}))
"""
)


@pytest.fixture(scope="module")
def torch_first(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("torch_first")
    facts, run = run_scenario(tmp, TORCH_FIRST, name="notebook.py")
    return facts, run, f"{tmp / 'notebook.py'}:{line_of(TORCH_FIRST, '# CUDA is first initialized here')}"


def test_cuda_initialized_by_a_tensor_switches_to_the_forkserver_naming_the_line_and_works(torch_first):
    facts, run, site = torch_first
    said = f"nblaunch: using the forkserver, not fork, because CUDA was initialized in this kernel at {site}"
    assert said in run.stdout, run.stdout
    assert facts["method"] == "forkserver"
    assert facts["value"] == {"backend": "nccl", "device": 0, "sum": float(facts["n"])}


def test_fork_after_cuda_was_initialized_is_the_clear_error_naming_the_line(torch_first):
    facts, _, site = torch_first
    assert facts["fork_error"] is not None, "fork was accepted with CUDA initialized in the launching process"
    assert (
        "start_method='fork' is not possible: CUDA is already initialized in this kernel at " + site
        in (facts["fork_error"])
    )


DRIVER_FIRST = (
    """import ctypes, json, os, select, sys
import torch
from kernelside import LaunchConfigError, last_report, notebook_launcher
from kernelside.launch import cuda_guard
"""
    + RANK_DEVICE
    + '''

def raw_forked_child_uses_cuda():
    """What a forked rank meets when nothing checks: fork, then CUDA in the child."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            torch.ones(1, device="cuda")
            torch.cuda.synchronize()
            msg = "ok"
        except BaseException as e:
            msg = f"{type(e).__name__}: {e}"
        os.write(w, msg.encode()[:4000])
        os._exit(0)
    os.close(w)
    ready, _, _ = select.select([r], [], [], 30)
    msg = os.read(r, 4096).decode() if ready else "no answer within 30 s"
    if not ready:
        os.kill(pid, 9)
    os.waitpid(pid, 0)
    os.close(r)
    return msg


mode = sys.argv[1]
n = torch.cuda.device_count()
facts = {"mode": mode, "n": n, "before": cuda_guard.driver_state()[0]}
if mode == "cuinit":
    facts["cuinit_rc"] = ctypes.CDLL("libcuda.so.1").cuInit(0)
elif mode == "is_available":
    facts["is_available"] = torch.cuda.is_available()
elif mode == "loaded":
    ctypes.CDLL("libcuda.so.1")
elif mode == "imports":
    import accelerate, transformers
    from accelerate import Accelerator, notebook_launcher as accelerate_launcher
    from transformers import GPT2Config, GPT2LMHeadModel
    facts["versions"] = [accelerate.__version__, transformers.__version__]
state, path = cuda_guard.driver_state()
facts.update(state=state, path=path, torch_initialized=torch.cuda.is_initialized(),
             detected=cuda_guard.is_cuda_initialized(), site=cuda_guard.first_init_site())
facts["value"] = notebook_launcher(rank_device, num_processes=n)
facts["method"] = last_report().start_method
facts["fork_error"] = None
if facts["method"] != "fork":  # then start_method="fork" must be refused
    try:
        notebook_launcher(rank_device, num_processes=n, start_method="fork")
    except LaunchConfigError as e:
        facts["fork_error"] = str(e)
facts["raw_fork_child"] = raw_forked_child_uses_cuda()
print("RESULT " + json.dumps(facts))
'''
)


@pytest.fixture(scope="module")
def driver_first(tmp_path_factory):
    runs = {}

    def run(mode):
        if mode not in runs:
            runs[mode] = run_scenario(tmp_path_factory.mktemp(mode), DRIVER_FIRST, mode, name="notebook.py")
        return runs[mode]

    return run


def test_cuinit_below_torch_is_detected_and_the_launch_uses_the_forkserver_saying_why(driver_first):
    facts, run = driver_first("cuinit")
    assert facts["cuinit_rc"] == 0 and facts["before"] != "initialized"  # importing torch may load, not init
    assert facts["torch_initialized"] is False  # torch never heard of it
    assert facts["state"] == "initialized" and facts["detected"] is True, facts
    assert facts["site"].startswith(cuda_guard.BELOW_TORCH) and facts["path"] in facts["site"]
    said = (
        "nblaunch: using the forkserver, not fork, because CUDA was initialized in this kernel by a library below torch"
    )
    assert said in run.stdout, run.stdout
    assert facts["method"] == "forkserver" and facts["value"]["sum"] == float(facts["n"])


def test_fork_after_cuinit_below_torch_is_the_clear_error(driver_first):
    facts, _ = driver_first("cuinit")
    assert facts["fork_error"] is not None, "fork was accepted after cuInit"
    refusal = "start_method='fork' is not possible: CUDA is already initialized in this kernel by a library below torch"
    assert refusal in facts["fork_error"]


def test_without_the_check_a_forked_child_cannot_use_cuda_after_cuinit(driver_first):
    facts, _ = driver_first("cuinit")
    assert facts["raw_fork_child"] != "ok", "a raw fork after cuInit could use CUDA: the detection would be needless"


def test_torch_cuda_is_available_avoids_fork_exactly_when_a_forked_child_would_fail(driver_first):
    facts, _ = driver_first("is_available")
    assert facts["is_available"] is True and facts["torch_initialized"] is False
    fork_breaks = facts["raw_fork_child"] != "ok"
    assert (facts["method"] == "forkserver") == fork_breaks, facts
    assert facts["value"]["sum"] == float(facts["n"])


def test_cuda_driver_merely_loaded_keeps_fork(driver_first):
    facts, _ = driver_first("loaded")
    assert facts["state"] == "loaded" and facts["detected"] is False, facts
    assert facts["method"] == "fork"
    assert facts["value"] == {"backend": "nccl", "device": 0, "sum": float(facts["n"])}
    assert facts["raw_fork_child"] == "ok"


def test_importing_accelerate_and_transformers_leaves_fork_available(driver_first):
    facts, _ = driver_first("imports")
    assert facts["torch_initialized"] is False and facts["detected"] is False, facts
    assert facts["method"] == "fork" and facts["value"]["sum"] == float(facts["n"])
