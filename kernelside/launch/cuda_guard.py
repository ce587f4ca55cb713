"""Remember where CUDA was first initialized in this process.

Forking a process that holds a CUDA context gives children a broken context, so the
launch plan must know whether CUDA is initialized in the kernel, and the user must be
told *where* that happened so they can move it. torch initializes CUDA lazily through
``torch.cuda._lazy_init``; the C++ side looks that attribute up on the module on every
call, so wrapping it once catches tensor creation on a GPU as well as the Python API.

Example::

    >>> install()            # done by ``import kernelside``
    >>> first_init_site()    # None until something initializes CUDA
"""

from __future__ import annotations

import sys
import traceback

_state: dict = {"site": None, "installed_on": None}

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
    ip = sys.modules.get("IPython")
    shell = ip.get_ipython() if ip is not None and hasattr(ip, "get_ipython") else None
    compiler = getattr(shell, "compile", None)
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
        site = None if was or _state["site"] else _describe_caller()
        result = original(*args, **kwargs)
        if site and cuda_module.is_initialized() and not _state["site"]:
            _state["site"] = site
        return result

    _lazy_init_recording._nblaunch_wrapped = True
    _lazy_init_recording.__wrapped__ = original
    cuda_module._lazy_init = _lazy_init_recording
    _state["installed_on"] = cuda_module


def is_cuda_initialized() -> bool:
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        return bool(torch.cuda.is_initialized())
    except Exception:
        return False


def first_init_site() -> str | None:
    """Where CUDA was first initialized, if it happened after ``install()``."""
    return _state["site"]
