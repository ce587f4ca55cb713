"""Exit at once with one line on stderr unless this interpreter's torch can use a CUDA GPU.

``make test-gpu`` and ``tests/gpu/on_device.sh`` run it before anything else, with the python
that will run the tests, so the GPU kit never reports a pass it did not run. It is a process of
its own: initializing CUDA here does not touch the test process.

Example::

    $ python tests/gpu/require_cuda.py; echo $?
    no CUDA device: make test-gpu needs a machine with a GPU
    1

``--driver-only`` checks only for the NVIDIA driver, without importing torch (any python will do).
"""

from __future__ import annotations

import glob
import os
import sys

NO_CUDA = "no CUDA device: make test-gpu needs a machine with a GPU"


def nvidia_driver_present() -> bool:
    """The NVIDIA kernel driver's traces (WSL's /dev/dxg included); without them there is no CUDA device."""
    return os.path.exists("/proc/driver/nvidia") or bool(glob.glob("/dev/nvidia[0-9]*")) or os.path.exists("/dev/dxg")


def cuda_usable() -> bool:
    if not nvidia_driver_present():
        return False  # no need to import torch (seconds) to know
    try:
        import torch

        return bool(torch.cuda.is_available()) and torch.cuda.device_count() > 0
    except Exception:  # no torch, or a broken CUDA install: either way, no GPU to test on
        return False


def main() -> int:
    usable = nvidia_driver_present() if "--driver-only" in sys.argv[1:] else cuda_usable()
    if not usable:
        print(NO_CUDA, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
