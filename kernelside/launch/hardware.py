"""What the launch plan asks of this machine's hardware: each question asked in one place only.

The GPU count comes through NVML (torch's ``device_count``), which leaves the CUDA driver untouched, so a
kernel that asks can still fork its workers. Whether the CPU has fp16 kernels is oneDNN's answer, the one
DeepSpeed's CPU accelerator acts on. Machines differ in both: tests take the branch their machine takes
and cover the other by replacing these functions, the only places nblaunch asks. The panel's fuller
description (names, memory, versions) is ``kernelside/hardware_facts.py``'s, which never imports torch.

Example::

    >>> gpu_count() >= 0
    True
"""

from __future__ import annotations


def gpu_count() -> int:
    """Visible CUDA GPUs, without initializing CUDA here (0 without a CUDA build of torch)."""
    try:
        import torch
    except ImportError:
        return 0
    if not torch.backends.cuda.is_built():
        return 0
    return torch.cuda.device_count()


def cpu_has_fp16_kernels() -> bool:
    """Whether oneDNN has fp16 kernels on this CPU (AVX512-FP16 or AMX-FP16): the question DeepSpeed's CPU
    accelerator asks before it runs fp16 (it refuses "Type fp16 is not supported on your device" otherwise).

    Example::

        >>> cpu_has_fp16_kernels() in (True, False)
        True
    """
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    except Exception:  # a torch built without oneDNN has no such kernels
        return False
