"""Which classes mark sharded objects (DTensor, FSDP1 and FSDP2 modules, FSDP1's flat parameters, device meshes):
only those of modules already loaded, since a process that never imported one holds none of its objects.

Every rank asks at the end of every cell (``sharded_results.gather_for_return``, the result's pickler), so the
answer is kept per set of loaded modules.

Example::

    >>> "dtensor" in torch_classes()   # doctest: +SKIP
    False
"""

from __future__ import annotations

import sys

_SHARD_MODULES = ("torch.distributed.tensor", "torch.distributed.fsdp", "torch.distributed.device_mesh")
_CLASSES: dict[tuple[bool, ...], dict] = {}  # which of _SHARD_MODULES are loaded -> their classes (never changes)


def torch_classes() -> dict:
    """The classes that mark sharded objects; only those whose modules are loaded (none loaded: none exist).
    Looked up once per set of loaded modules: every rank asks at the end of every cell."""
    loaded = tuple(m in sys.modules for m in _SHARD_MODULES)
    found = _CLASSES.get(loaded)
    if found is None:
        found = _CLASSES[loaded] = _import_classes()
    return found


def _import_classes() -> dict:
    found = {}
    if "torch.distributed.tensor" in sys.modules:
        from torch.distributed.tensor import DTensor

        found["dtensor"] = DTensor
    if "torch.distributed.fsdp" in sys.modules:
        from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel
        from torch.distributed.fsdp._flat_param import FlatParameter

        found.update(fsdp1=FullyShardedDataParallel, fsdp2=FSDPModule, flat=FlatParameter)
    if "torch.distributed.device_mesh" in sys.modules:
        from torch.distributed.device_mesh import DeviceMesh

        found["mesh"] = DeviceMesh
    return found


def shard_types() -> tuple[type, ...]:
    """The types of objects that are shards (for the pickler's last check before sending; () when none exist)."""
    cls = torch_classes()
    return tuple(cls[k] for k in ("dtensor", "flat", "fsdp1", "fsdp2") if k in cls)


def describe_shard(obj) -> str:
    """'a DTensor (shape [4, 2])', 'an FSDP2 module (Net)', ...: what a shard found in a return value is."""
    if hasattr(obj, "device_mesh") and hasattr(obj, "placements"):
        return f"a DTensor (shape {list(obj.shape)}, placements {tuple(obj.placements)})"
    if type(obj).__name__ == "FlatParameter":
        return "an FSDP1 flat parameter"
    return f"an FSDP module ({type(obj).__name__})"
