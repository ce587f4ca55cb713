"""A forged NVML for the server's tests: the figures a machine with GPUs would answer, for the pids a test
names, through the same calls ``kernelside.nvml_devices.NvmlSampler`` makes of pynvml. It stands in for the
NVIDIA driver (absent here), not for nblaunch's code, which reads it exactly as it reads the real one.

Example::

    >>> nv = ForgedNvml({0: [(4242, 3 * 2**30, 87)]}, process_util={0: True})
    >>> nv.nvmlDeviceGetCount()
    1
"""

from __future__ import annotations

from types import SimpleNamespace


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):  # noqa: N801 - pynvml's own name
    pass


class ForgedNvml:
    """``gpus``: {index: [(pid, used bytes, SM %)]}; ``process_util``: {index: True} where NVML samples
    processes (elsewhere NotSupported, as on some VMs: the GPU's own figure is used); ``device_util``: its %."""

    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported

    def __init__(self, gpus: dict, process_util: dict | None = None, device_util: dict | None = None):
        self.gpus, self.process_util = gpus, process_util or {}
        self.device_util = device_util or {}
        self.asked = 0  # utilization samples asked for: the server samples on every request

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802 - pynvml's names
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int):  # noqa: N802
        return index

    def nvmlDeviceGetComputeRunningProcesses(self, handle):  # noqa: N802
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used, _ in self.gpus[handle]]

    def nvmlDeviceGetProcessUtilization(self, handle, since_us: int):  # noqa: N802
        if not self.process_util.get(handle):
            raise NVMLError_NotSupported("Not Supported")
        self.asked += 1
        return [SimpleNamespace(pid=pid, timeStamp=since_us + 1, smUtil=sm) for pid, _, sm in self.gpus[handle]]

    def nvmlDeviceGetUtilizationRates(self, handle):  # noqa: N802
        return SimpleNamespace(gpu=self.device_util.get(handle, 0), memory=0)
