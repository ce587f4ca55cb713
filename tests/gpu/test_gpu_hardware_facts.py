"""The panel's hardware list and the Runs view's GPU figures come from NVML (kernelside/nvml_devices.py),
without torch in the Jupyter server: on a GPU they must name what torch sees.

torch's own answers are asked in a child process, so this process (the kernel's stand-in) never
initializes CUDA.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import torch
from gpu_scenario import REPO

from kernelside.hardware_facts import detect_hardware
from kernelside.nvml_devices import NvmlSampler

TORCH_GPUS = (
    "import json, torch; print(json.dumps([[torch.cuda.get_device_name(i), "
    "torch.cuda.get_device_properties(i).total_memory] for i in range(torch.cuda.device_count())]))"
)
HOLD_MEMORY = (
    "import sys, torch; t = torch.empty(256 * 2**20, dtype=torch.uint8, device='cuda'); torch.cuda.synchronize(); "
    "print('ready', flush=True); sys.stdin.read()"
)


def test_the_panels_gpu_list_names_every_gpu_torch_sees_with_its_memory_and_cuda_version():
    facts = detect_hardware()
    probe = subprocess.run([sys.executable, "-c", TORCH_GPUS], capture_output=True, text=True, timeout=120)
    seen = json.loads(probe.stdout.strip().splitlines()[-1])
    assert [g["index"] for g in facts["gpus"]] == list(range(len(seen))) and seen
    assert [g["name"] for g in facts["gpus"]] == [name for name, _ in seen]
    for gpu, (_, total) in zip(facts["gpus"], seen, strict=True):
        # NVML counts the whole framebuffer, CUDA what it can allocate: a few percent apart at most
        assert total <= gpu["memory_bytes"] <= total * 1.05, (gpu, total)
    assert facts["torch_version"] == torch.__version__ and facts["cuda_version"] == torch.version.cuda
    assert facts["cuda_available"] is True


def test_the_runs_views_sampler_finds_a_process_holding_gpu_memory():
    child = subprocess.Popen(
        [sys.executable, "-c", HOLD_MEMORY], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        found = NvmlSampler.all_devices().by_pid({child.pid})
        assert child.pid in found, found
        figures = found[child.pid]
        assert figures["gpu_index"] is not None and figures["gpu_memory_bytes"] >= 256 * 2**20, figures
    finally:
        child.stdin.close()
        child.wait(60)
        child.stdout.close()


OWNER = """
import json, sys
from kernelside import last_report, notebook_launcher

def hold(release, mib):
    import os, time, torch, torch.distributed as dist
    rank = dist.get_rank()
    block = torch.empty(mib[rank] * 2**20, dtype=torch.uint8, device="cuda")  # a size per rank: who is who
    torch.cuda.synchronize()
    held_from, deadline = time.monotonic(), time.monotonic() + 90  # the test releases them once it has read
    # the figures; and the block stays 2.5 s at least, for the kernel's report, which samples NVML every second
    while (not os.path.exists(release) or time.monotonic() - held_from < 2.5) and time.monotonic() < deadline:
        time.sleep(0.05)
    return os.getpid(), str(block.device), dist.get_backend()

mib = json.loads(sys.argv[2])
got = notebook_launcher(hold, args=(sys.argv[1], mib), num_processes=2, gpu_ids="0", return_all=True, timeout=150)
ranks = [[r.rank, r.pid, r.gpu_index, r.gpu_memory_bytes] for r in last_report().ranks]
print("RESULT " + json.dumps({"got": got, "ranks": ranks}))
"""
MIB = [256, 768]  # rank 0 and rank 1 hold this much on the card


def _running_state(base) -> dict | None:
    """The run's state once it runs with both ranks' pids written, else None."""
    for state_file in base.glob("nblaunch-*/run-*/state.json"):
        try:
            state = json.loads(state_file.read_text())
        except (OSError, ValueError):
            return None  # replaced atomically, so only a folder just made has none yet
        state["ranks"] = sorted(state.get("ranks") or [], key=lambda r: r.get("rank", -1))
        if state.get("state") == "running" and [r.get("rank") for r in state["ranks"]] == [0, 1]:
            return state if all(r.get("pid") for r in state["ranks"]) else None
    return None


def _held(nvml, handle) -> dict[int, int]:
    """pid -> the GPU memory NVML counts for it on that GPU."""
    return {p.pid: p.usedGpuMemory or 0 for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)}


def test_the_runs_view_maps_each_ranks_gpu_memory_to_its_rank_with_cuda_visible_devices_honoured(
    tmp_path, monkeypatch, nvml, visible
):
    """Two ranks on one card through gloo (gpu_ids="0"), the launching process seeing only the last GPU, named
    by its UUID: the state file names each rank's pid and that GPU, and the server's /nblaunch/runs answer gives
    each rank the memory NVML counts for that pid, on the NVML index of that GPU."""
    from harness import JupyterServer  # the real `jupyter server` starter of the server tests

    _, handle, uuid = visible[-1]
    nvml_index = nvml.nvmlDeviceGetIndex(handle)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    release = tmp_path / "release"
    script = tmp_path / "owner.py"
    script.write_text(OWNER)
    monkeypatch.setenv("TMPDIR", str(tmp))  # the server's default run folders, and the owner's
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": uuid}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
    root = tmp_path / "root"
    root.mkdir()
    server = JupyterServer(str(root))
    owner = subprocess.Popen(
        [sys.executable, str(script), str(release), json.dumps(MIB)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    state, runs, detail, held = None, None, None, {}
    try:
        assert server.running.wait(120) and server.port, "".join(server.log[-30:])
        deadline = time.monotonic() + 120
        # the owner and its ranks are other processes: their progress is read, not awaited
        while owner.poll() is None and time.monotonic() < deadline:
            state = _running_state(tmp)
            held = _held(nvml, handle)
            if state and all(held.get(r["pid"], 0) >= m * 2**20 for r, m in zip(state["ranks"], MIB, strict=True)):
                _, runs = server.get("nblaunch/runs")
                _, detail = server.get(f"nblaunch/runs/{state['id']}")
                held = _held(nvml, handle)
                break
            time.sleep(0.1)
    finally:
        release.touch()
        try:
            out, err = owner.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            owner.kill()  # the process this test started, by its pid
            out, err = owner.communicate()
        server.stop()
    assert owner.returncode == 0, f"{out[-3000:]}\n{err[-3000:]}"
    assert detail is not None, f"the ranks were not both on the GPU within 120 s: state {state}, NVML {held}"
    assert [r["id"] for r in runs if r["live"]] == [state["id"]], runs
    ranks = sorted(detail["ranks"], key=lambda r: r["rank"])
    assert [(r["rank"], r["pid"]) for r in ranks] == [(r["rank"], r["pid"]) for r in state["ranks"]]
    assert [r["gpu"] for r in state["ranks"]] == [uuid, uuid]  # each rank's CUDA_VISIBLE_DEVICES entry
    for r, mib in zip(ranks, MIB, strict=True):
        assert r["gpu_index"] == nvml_index, r  # the server numbers GPUs as NVML does
        assert abs(r["gpu_memory_bytes"] - held[r["pid"]]) <= 2 * 2**20, (r, held)
        assert r["gpu_memory_bytes"] >= mib * 2**20, r
    # rank 1 holds 512 MiB more than rank 0: the figures are each rank's own, not swapped or summed
    difference = ranks[1]["gpu_memory_bytes"] - ranks[0]["gpu_memory_bytes"]
    assert abs(difference - (MIB[1] - MIB[0]) * 2**20) <= 32 * 2**20, ranks
    result = json.loads([ln for ln in out.splitlines() if ln.startswith("RESULT ")][-1].removeprefix("RESULT "))
    assert [g[0] for g in result["got"]] == [r["pid"] for r in ranks]
    assert [g[1:] for g in result["got"]] == [["cuda:0", "gloo"]] * 2  # one card, two ranks: gloo
    for rank, pid, gpu_index, memory in result["ranks"]:  # the kernel's report numbers GPUs as its CUDA does
        assert (pid, gpu_index) == (ranks[rank]["pid"], 0) and memory >= MIB[rank] * 2**20, result["ranks"]
