"""Detecting the CUDA driver initialized below torch (ctypes cuInit, CuPy, JAX...) from /proc/self/maps.

On this machine there is no CUDA driver: the real maps of this process must show none, and the
parser is checked on maps text as Linux writes it. The driver's own answer (initialized or merely
loaded) is checked on a GPU machine by tests/gpu/test_gpu_cuda_guard.py.
"""

from __future__ import annotations

import os

from kernelside.launch import cuda_guard

# Lines in the format of proc(5): address, perms, offset, dev, inode, path (absent for anonymous maps).
MAPS_WITH_DRIVER = """\
55d0c0a00000-55d0c0a2a000 r--p 00000000 103:02 1835012   /usr/bin/python3.12
7f21b4000000-7f21b4021000 rw-p 00000000 00:00 0
7f21b8a00000-7f21b8c3b000 r-xp 00000000 103:02 2229140   /opt/venv/nvidia/cu13/lib/libcudart.so.13
7f21ba000000-7f21bb9f3000 r-xp 00000000 103:02 2100551   /usr/lib/x86_64-linux-gnu/libcuda.so.580.159.03
7f21bc100000-7f21bc13a000 r-xp 00000000 103:02 2100560   /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.159.03
7ffd2a9e1000-7ffd2aa02000 rw-p 00000000 00:00 0                          [stack]
"""

MAPS_RUNTIME_ONLY = """\
7f21b8a00000-7f21b8c3b000 r-xp 00000000 103:02 2229140   /opt/venv/nvidia/cu13/lib/libcudart.so.13
7f21bc100000-7f21bc13a000 r-xp 00000000 103:02 2100560   /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1
7f21bc200000-7f21bc23a000 r-xp 00000000 103:02 2100561   /opt/stubs/libcuda_stub.so
7f21bc300000-7f21bc33a000 r-xp 00000000 103:02 2100562   /usr/lib/libcudadebugger.so.1
"""


def test_driver_library_is_found_in_maps_text_by_its_file_name():
    assert cuda_guard.driver_library_in_maps(MAPS_WITH_DRIVER) == "/usr/lib/x86_64-linux-gnu/libcuda.so.580.159.03"
    deleted = "7f00-7f01 r-xp 00000000 08:01 42   /usr/lib64/libcuda.so.1 (deleted)\n"
    assert cuda_guard.driver_library_in_maps(deleted) == "/usr/lib64/libcuda.so.1"
    assert cuda_guard.driver_library_in_maps("7f00-7f01 r-xp 00000000 08:01 42   /usr/lib/libcuda.so\n")


def test_runtime_nvml_and_lookalike_libraries_are_not_the_driver():
    assert cuda_guard.driver_library_in_maps(MAPS_RUNTIME_ONLY) is None
    assert cuda_guard.driver_library_in_maps("") is None


def test_this_process_real_maps_hold_no_driver_and_cuda_counts_as_not_initialized():
    with open(f"/proc/{os.getpid()}/maps") as fh:
        real = fh.read()
    assert "python" in real  # the real text, in the format the parser reads
    assert cuda_guard.driver_library_in_maps(real) is None
    assert cuda_guard.driver_state() == (None, None)
    assert cuda_guard.is_cuda_initialized() is False
    assert cuda_guard.first_init_site() is None
