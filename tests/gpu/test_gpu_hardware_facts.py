"""The panel's hardware list and the Runs view's GPU figures come from NVML (kernelside/nvml_devices.py),
without torch in the Jupyter server: on a GPU they must name what torch sees.

torch's own answers are asked in a child process, so this process (the kernel's stand-in) never
initializes CUDA.
"""

from __future__ import annotations

import json
import subprocess
import sys

import torch

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
