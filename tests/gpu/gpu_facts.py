"""What NVML says about the GPUs, for the GPU tests: UUIDs, memory in use, and who holds it.

The launching process reads these through NVML only, never through torch.cuda, so that reading
them does not initialize CUDA there.

Example::

    >>> released, held = wait_gpu_released(pynvml, handles, baseline, {worker_pid}, within=5.0)
"""

from __future__ import annotations

import time


def text(value) -> str:
    """nvidia-ml-py returns str in new versions and bytes in old ones."""
    return value.decode() if isinstance(value, bytes) else str(value)


def same_uuid(a: str, b: str) -> bool:
    """NVML writes 'GPU-<uuid>', torch's device properties the bare '<uuid>'."""
    return a.lower().removeprefix("gpu-") == b.lower().removeprefix("gpu-")


def used_bytes(nvml, handles) -> list[int]:
    return [int(nvml.nvmlDeviceGetMemoryInfo(h).used) for h in handles]


def holders(nvml, handles) -> set[int]:
    """Pids NVML lists as holding memory on these GPUs."""
    return {p.pid for h in handles for p in nvml.nvmlDeviceGetComputeRunningProcesses(h)}


GPU_SLACK_BYTES = 64 * 2**20


def wait_gpu_released(nvml, handles, baseline: list[int], pids: set[int], within: float) -> tuple[bool, str]:
    """Wait until none of ``pids`` holds GPU memory and every GPU is back to ``baseline`` (+64 MiB).

    The driver frees a dead process's memory shortly after the process is reaped, so this polls
    NVML until then or ``within`` seconds; returns (released, what was still held)."""
    deadline = time.monotonic() + within
    while True:
        left = holders(nvml, handles) & pids
        used = used_bytes(nvml, handles)
        over = [(i, u - b) for i, (u, b) in enumerate(zip(used, baseline, strict=True)) if u - b > GPU_SLACK_BYTES]
        if not left and not over:
            return True, ""
        if time.monotonic() >= deadline:
            return False, f"pids still on the GPU: {sorted(left)}; GPUs above their baseline (index, bytes): {over}"
        time.sleep(0.05)
