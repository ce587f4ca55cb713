"""How many GPUs the launch plan can use, found without initializing CUDA in the calling process.

torch answers it through NVML, which leaves the CUDA driver untouched, so a kernel that asks can
still fork its workers. The panel's fuller description (names, memory, versions) is
``kernelside/hardware_facts.py``'s, which never imports torch.

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
