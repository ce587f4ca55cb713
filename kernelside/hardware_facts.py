"""What this machine has, for the launch panel, read without importing torch and without CUDA.

CPUs and RAM come from the OS (``sched_getaffinity``, ``sysconf``), GPUs from NVML
(``nvml_devices.describe_gpus``: names and memory as the driver reports them, numbered as CUDA numbers
them under this process's ``CUDA_VISIBLE_DEVICES``), and the torch and CUDA versions from the
installed torch's own ``torch/version.py``, read as text. The Jupyter server calls this: it never
imports torch, and asking takes milliseconds instead of a child interpreter's seconds.

Example::

    >>> detect_hardware()["cpu_count"] >= 1
    True
"""

from __future__ import annotations

import ast
import importlib.util
import os
import sys

from .nvml_devices import describe_gpus


def _ram_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def torch_build() -> tuple[str | None, str | None]:
    """(torch version, CUDA version it was built for) from the installed ``torch/version.py``, without
    importing torch; (None, None) when torch is not installed.

    Example::

        >>> torch_build()                    # doctest: +SKIP
        ('2.13.0+cpu', None)
    """
    try:
        spec = importlib.util.find_spec("torch")  # a top-level name: finds, imports nothing
    except (ImportError, ValueError):
        return None, None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        try:
            with open(os.path.join(folder, "version.py")) as fh:
                tree = ast.parse(fh.read())
        except (OSError, SyntaxError, ValueError):
            continue
        found = {}
        for node in tree.body:
            target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
            if isinstance(target, ast.Name) and target.id in ("__version__", "cuda") and node.value is not None:
                try:
                    found[target.id] = ast.literal_eval(node.value)
                except ValueError:
                    pass
        return found.get("__version__"), found.get("cuda")
    return None, None


def detect_hardware() -> dict:
    """CPU count, RAM, torch/CUDA versions and GPUs (index, name, memory), as plain JSON data."""
    torch_version, cuda_version = torch_build()
    gpus = describe_gpus()
    return {
        "cpu_count": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "ram_bytes": _ram_bytes(),
        "python": sys.executable,
        "gpus": gpus,
        "torch_version": torch_version,
        "cuda_version": cuda_version,
        "cuda_available": bool(cuda_version and gpus),
    }
