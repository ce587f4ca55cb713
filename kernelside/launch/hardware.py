"""What this machine has, found without initializing CUDA in the calling process.

``gpu_count()`` is what the launch plan needs: torch answers it through NVML, which leaves
the CUDA driver untouched, so a kernel that asks can still fork its workers.  The full
description (names, memory) needs the CUDA runtime, so ``detect_hardware()`` asks a
short-lived child interpreter and the caller's process never holds a CUDA context.

Example::

    >>> detect_hardware()["cpu_count"] >= 1
    True
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

_PROBE = r"""
import json, os, platform
out = {"gpus": [], "torch_version": None, "cuda_version": None, "cuda_available": False}
try:
    import torch
    out["torch_version"] = torch.__version__
    out["cuda_version"] = torch.version.cuda
    if torch.cuda.is_available():
        out["cuda_available"] = True
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            out["gpus"].append({"index": i, "name": p.name, "memory_bytes": int(p.total_memory)})
except Exception as e:  # report, never crash the caller
    out["error"] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
"""


def gpu_count() -> int:
    """Visible CUDA GPUs, without initializing CUDA here (0 without a CUDA build of torch)."""
    try:
        import torch
    except ImportError:
        return 0
    if not torch.backends.cuda.is_built():
        return 0
    return torch.cuda.device_count()


def _ram_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def detect_hardware(timeout: float = 60.0) -> dict:
    """CPU count, RAM, torch/CUDA versions and GPUs (index, name, memory), as plain JSON data."""
    info = {
        "cpu_count": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "ram_bytes": _ram_bytes(),
        "python": sys.executable,
    }
    try:
        proc = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=timeout)
        probe = (
            json.loads(proc.stdout.strip().splitlines()[-1])
            if proc.stdout.strip()
            else {"gpus": [], "error": proc.stderr.strip()[-500:]}
        )
    except (subprocess.TimeoutExpired, json.JSONDecodeError) as e:
        probe = {"gpus": [], "error": f"hardware probe failed: {e}"}
    info.update(probe)
    return info
