"""A stand-in for NVIDIA's ``pynvml`` on the browser tests' ``jupyter lab`` path: two GPUs, with the compute
processes on each read, at every call, from the JSON file ``$NBLAUNCH_TEST_FORGED_NVML``
(``{"0": [[pid, used bytes, SM %], ...], "1": [...]}``), which a test writes once it knows its ranks' pids.
It stands in for the driver this machine lacks (tests/panel_routes/forged_nvml.py answers the same calls),
not for nblaunch's code, which reads it exactly as it reads the real one: a dashboard with GPU charts, seen.

Only the lab server gets it: in any other process (the kernel, its ranks) importing it fails as when pynvml
is not installed, so a launch there is the CPU launch it always is.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

if not sys.argv or "jupyterlab" not in sys.argv[0]:
    raise ImportError("the tests' forged pynvml answers only in their jupyter lab server")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "panel_routes"))
from forged_nvml import ForgedNvml, NVMLError, NVMLError_NotSupported  # noqa: E402

__all__ = ["NVMLError", "NVMLError_NotSupported"]
GPUS = 2


def _current() -> ForgedNvml:
    try:
        listed = json.loads(Path(os.environ["NBLAUNCH_TEST_FORGED_NVML"]).read_text())
    except (OSError, ValueError):
        listed = {}
    wave = 10 * math.sin(time.monotonic() / 3)  # utilisation that moves, as a training step's does
    gpus = {
        i: [(pid, used, max(0, min(100, sm + wave))) for pid, used, sm in listed.get(str(i), [])] for i in range(GPUS)
    }
    return ForgedNvml(gpus, process_util={0: True, 1: True})


def nvmlInit() -> None:  # noqa: N802 - pynvml's names
    pass


def nvmlDeviceGetCount() -> int:  # noqa: N802
    return GPUS


def nvmlDeviceGetHandleByIndex(index: int):  # noqa: N802
    return index


def nvmlDeviceGetName(handle) -> str:  # noqa: N802
    return "NVIDIA H200 (forged)"


def nvmlDeviceGetMemoryInfo(handle):  # noqa: N802
    return SimpleNamespace(total=141 * 2**30)


def nvmlDeviceGetUUID(handle) -> str:  # noqa: N802
    return f"GPU-f0f0f0f0-0000-0000-0000-00000000000{handle}"


def nvmlDeviceGetComputeRunningProcesses(handle):  # noqa: N802
    return _current().nvmlDeviceGetComputeRunningProcesses(handle)


def nvmlDeviceGetProcessUtilization(handle, since_us: int):  # noqa: N802
    return _current().nvmlDeviceGetProcessUtilization(handle, int(time.time() * 1e6) - 1)


def nvmlDeviceGetUtilizationRates(handle):  # noqa: N802
    return _current().nvmlDeviceGetUtilizationRates(handle)
