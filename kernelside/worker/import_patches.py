"""Patch a library in a rank whether it was imported before the fork or is imported later, inside the rank.

``when_imported(name, patch)`` calls ``patch(module)`` now if ``name`` is already in ``sys.modules`` (inherited from the
kernel by fork), else as soon as the module finishes importing: one meta-path finder asks the other finders for the
module and wraps its loader. The metrics capture (``metric_capture.py``), the Lightning bar (``lightning_bars.py``) and
the DeepSpeed plugin rule (``accelerate_ranks.py``) all patch through it.

The registry is per process on purpose: a rank is one process, and a patch belongs to the whole of it.

Example::

    >>> when_imported("accelerate.accelerator", lambda module: None)   # doctest: +SKIP
"""

from __future__ import annotations

import importlib.abc
import sys

# module name -> patches to apply once it is imported (process-wide: see above)
_WATCHED: dict[str, list] = {}


def when_imported(name: str, patch) -> None:
    """Run ``patch(module)`` for the module ``name``: now if it is imported, else right after its import."""
    patches = _WATCHED.setdefault(name, [])
    if patch not in patches:
        patches.append(patch)
    module = sys.modules.get(name)
    if module is not None:
        patch(module)
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def _apply(module) -> None:
    for patch in _WATCHED.get(module.__name__, ()):
        patch(module)


class _PatchingLoader:
    """The real loader, plus the patches once the module has run."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _apply(module)

    def __getattr__(self, name):  # get_source, is_package, ...: whatever else asks the loader
        return getattr(self._loader, name)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a watched module it asks the other finders and wraps the loader."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in _WATCHED:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _PatchingLoader(spec.loader)
                return spec
        return None


_FINDER = _PatchOnImport()
