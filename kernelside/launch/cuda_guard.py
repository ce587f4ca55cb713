"""Remember where CUDA was first initialized in this process.

Forking a process that holds a CUDA context gives children a broken context, so the
launch plan must know whether CUDA is initialized in the kernel, and the user must be
told *where* that happened so they can move it. torch initializes CUDA lazily through
``torch.cuda._lazy_init``; the C++ side looks that attribute up on the module on every
call, so wrapping it once catches tensor creation on a GPU as well as the Python API.

Libraries below torch initialize the CUDA driver too (``ctypes.CDLL("libcuda.so.1").cuInit(0)``,
CuPy, JAX, Numba, ``torch.cuda.is_available()`` without NVML), and torch never hears of it; a
forked rank then fails on its first CUDA call. So the driver itself is asked as well: if
``libcuda`` is mapped in this process (``/proc/self/maps``), ``cuDeviceGetCount`` on the
already-loaded library tells initialized from merely loaded without initializing anything.

Example::

    >>> install_when_torch_loads()   # done by ``import kernelside``: now, or when torch.cuda is imported
    >>> first_init_site()    # None until something initializes CUDA
"""

from __future__ import annotations

import ctypes
import importlib.abc
import os
import re
import sys
import traceback

from ..kernel_shell import running_shell


class _FirstInit:
    """Where CUDA was first initialized in this process, and the ``torch.cuda`` module whose init is wrapped."""

    site: str | None = None
    installed_on = None


# Global on purpose: CUDA is initialized once per process, by whatever code, and the wrapper that
# notices it runs inside torch, where no launch object can be passed.
FIRST_INIT = _FirstInit()

_SKIP_PATHS = ("/torch/", "/kernelside/launch/cuda_guard.py", "/contextlib.py", "/functools.py")


def _describe_caller() -> str:
    """The first frame outside torch, as 'file:line' or 'cell [N] line L' for notebook cells."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        fn = frame.filename.replace("\\", "/")
        if any(p in fn for p in _SKIP_PATHS):
            continue
        return describe_location(frame.filename, frame.lineno, frame.line)
    return "an unknown place"


def describe_location(filename: str, lineno: int | None, line: str | None = None) -> str:
    """'cell In[3], line 2: x = ...' for IPython cells, 'path.py:12' for files."""
    where = f"{filename}:{lineno}"
    if "ipykernel_" in filename or filename.startswith("<ipython-input"):
        # IPython names cell files /tmp/ipykernel_<pid>/<hash>.py; the linecache entry
        # maps back to the execution count, which is what the user sees as In[N].
        count = _cell_execution_count(filename)
        where = f"cell In[{count}], line {lineno}" if count else f"a notebook cell, line {lineno}"
    if line:
        where += f": {line.strip()}"
    return where


def _cell_execution_count(filename: str) -> int | None:
    compiler = getattr(running_shell(), "compile", None)
    cache = getattr(compiler, "_filename_map", None)
    if isinstance(cache, dict):
        return cache.get(filename)
    return None


def install(cuda_module=None) -> None:
    """Wrap ``torch.cuda._lazy_init`` (or ``cuda_module._lazy_init``) to record the first init site."""
    if cuda_module is None:
        try:
            import torch.cuda as cuda_module
        except ImportError:
            return
    original = getattr(cuda_module, "_lazy_init", None)
    if original is None or getattr(original, "_nblaunch_wrapped", False):
        return

    def _lazy_init_recording(*args, **kwargs):
        was = cuda_module.is_initialized()
        site = None if was or FIRST_INIT.site else _describe_caller()
        result = original(*args, **kwargs)
        if site and cuda_module.is_initialized() and not FIRST_INIT.site:
            FIRST_INIT.site = site
        return result

    _lazy_init_recording._nblaunch_wrapped = True
    _lazy_init_recording.__wrapped__ = original
    cuda_module._lazy_init = _lazy_init_recording
    FIRST_INIT.installed_on = cuda_module


class _InstallOnTorchCudaImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when ``torch.cuda`` is about to load, it has the real loader call ``install``
    right after the module runs, then leaves ``sys.meta_path``. ``import kernelside`` does not import
    torch (the Jupyter server imports kernelside's contract and must stay torch-free), yet CUDA's
    first initialization must be recorded from that import on."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "torch.cuda":
            return None
        sys.meta_path.remove(self)
        for finder in sys.meta_path:
            spec = finder.find_spec(fullname, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        run_module = getattr(loader, "exec_module", None)
        if run_module is None:
            return spec

        def exec_then_install(module):
            run_module(module)
            install(module)

        loader.exec_module = exec_then_install  # this loader instance serves torch.cuda alone
        return spec


def install_when_torch_loads() -> None:
    """``install()`` now if torch is imported, else the moment ``torch.cuda`` is (once per process).

    Example::

        >>> install_when_torch_loads()
        >>> import torch
        >>> torch.cuda._lazy_init._nblaunch_wrapped
        True
    """
    if "torch.cuda" in sys.modules:
        install(sys.modules["torch.cuda"])
    elif not any(isinstance(f, _InstallOnTorchCudaImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _InstallOnTorchCudaImport())


def _torch_initialized() -> bool:
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        return bool(torch.cuda.is_initialized())
    except Exception:
        return False


def is_cuda_initialized() -> bool:
    """True once torch, or any library below it, has initialized CUDA in this process (fork is then unsafe)."""
    return _torch_initialized() or driver_state()[0] == "initialized"


def first_init_site() -> str | None:
    """Where CUDA was first initialized: torch's first init site if recorded, else the driver below torch."""
    if FIRST_INIT.site:
        return FIRST_INIT.site
    state, path = driver_state()
    if state == "initialized" and not _torch_initialized():
        return (
            f"{BELOW_TORCH}: the CUDA driver ({path}) was initialized in this process outside torch.cuda "
            "(ctypes cuInit, CuPy, JAX, Numba, or torch.cuda.is_available() without PYTORCH_NVML_BASED_CUDA_CHECK=1)"
        )
    return None


# -- the CUDA driver, below torch -------------------------------------------------------------

BELOW_TORCH = "by a library below torch"  # first_init_site() starts so when torch did not do it
CUDA_ERROR_NOT_INITIALIZED = 3
_DRIVER_FILE = re.compile(r"(?:^|/)libcuda\.so(?:\.\d+)*$")


def driver_library_in_maps(maps_text: str) -> str | None:
    """The path of the CUDA driver library (``libcuda.so*``) if a ``/proc/PID/maps`` text lists it.

    Example::

        >>> driver_library_in_maps("7f..-7f.. r-xp 00000000 08:01 42   /usr/lib/libcuda.so.580.95")
        '/usr/lib/libcuda.so.580.95'
    """
    if "libcuda.so" not in maps_text:  # one search in C: a kernel with torch maps thousands of lines
        return None
    for line in maps_text.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 6:
            continue  # anonymous mappings have no path
        path = fields[5].strip().removesuffix(" (deleted)")
        if _DRIVER_FILE.search(path):
            return path
    return None


def driver_state() -> tuple[str | None, str | None]:
    """(state, path) of the CUDA driver in this process: (None, None) when it is not loaded,
    ("loaded", path) when loaded but never initialized, ("initialized", path) after ``cuInit``.

    Nothing is loaded or initialized by asking: ``RTLD_NOLOAD`` only finds a library already
    mapped, and ``cuDeviceGetCount`` answers CUDA_ERROR_NOT_INITIALIZED before ``cuInit``.

    Example::

        >>> driver_state()     # on a machine without the CUDA driver
        (None, None)
    """
    try:
        with open("/proc/self/maps") as fh:
            path = driver_library_in_maps(fh.read())
    except OSError:
        return None, None
    if path is None:
        return None, None
    try:
        lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_NOW)
        count = ctypes.c_int(0)
        rc = lib.cuDeviceGetCount(ctypes.byref(count))
    except (OSError, AttributeError):
        return "initialized", path  # mapped but cannot be asked: assume the worst (spawn is always safe)
    return ("loaded" if rc == CUDA_ERROR_NOT_INITIALIZED else "initialized"), path
