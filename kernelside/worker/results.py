"""A rank's return value on its way to the kernel: unwrapped from DDP, every tensor on CPU.

Example::

    >>> body = dumps_result({"w": torch.ones(2, device="cuda")})   # doctest: +SKIP
    >>> cloudpickle.loads(body)["w"].device                         # doctest: +SKIP
    device(type='cpu')
"""

from __future__ import annotations

import io
import sys
import types

from . import result_segments, shard_classes, sharded_results

# Under fork, classes and functions the notebook defined before the launch exist in the
# kernel too: results refer to them by name, so a returned ``Net`` instance is an instance
# of the notebook's own ``Net`` class, not of a copy. Global on purpose: one table per rank process,
# filled once as it starts, read by every pickling of a result.
_KERNEL_MAIN_OBJECTS: dict[str, int] = {}


def remember_kernel_main_objects() -> None:
    """Called once in a forked rank: the notebook's own classes and functions, by name."""
    main = sys.modules.get("__main__")
    for name, obj in list(vars(main).items()) if main is not None else ():
        if isinstance(obj, (type, types.FunctionType)) and getattr(obj, "__module__", None) == "__main__":
            if getattr(obj, "__qualname__", None) == name:
                _KERNEL_MAIN_OBJECTS[name] = id(obj)


def _kernel_main_attr(qualname: str):
    return getattr(sys.modules["__main__"], qualname)


def _identity(x):
    return x


# (segments, the shard types then loaded) -> the pickler class: made once, not at every result (a live rank
# sends one per cell). Global on purpose: per rank process, like the table above.
_PICKLERS: dict[tuple, type] = {}


def _to_cpu_pickler(segments: bool = False):
    """A cloudpickle pickler that moves every non-CPU tensor to CPU as it is written, wherever it sits.

    ``segments``: big CPU tensors pickle their storage's bytes as one out-of-band buffer (result_segments.py)."""
    shards = shard_classes.shard_types()
    key = (segments, shards)
    got = _PICKLERS.get(key)
    if got is None:
        got = _PICKLERS[key] = _make_pickler(segments, shards)
    return got


def _make_pickler(segments: bool, shards: tuple):
    import cloudpickle
    import torch

    class ToCPUPickler(cloudpickle.Pickler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._storages: dict[tuple[int, int], object] = {}  # one object per storage: pickle's memo shares it

        def reducer_override(self, obj):
            if segments:
                reduced = segment_reduction(self._storages, obj, torch)
                if reduced is not None:
                    return reduced
            if isinstance(obj, (type, types.FunctionType)) and _KERNEL_MAIN_OBJECTS.get(
                getattr(obj, "__qualname__", None)
            ) == id(obj):
                return (_kernel_main_attr, (obj.__qualname__,))
            if shards and isinstance(obj, shards):  # never send a shard that looks like the whole
                raise sharded_results.ShardedResultError(
                    f"{shard_classes.describe_shard(obj)} is still in the return value: it sits inside an object "
                    "nblaunch does not look into (one that pickles itself). Return it in a dict, list, tuple or module."
                )
            if isinstance(obj, torch.Tensor) and obj.device.type != "cpu":
                cpu = obj.detach().to("cpu")
                if isinstance(obj, torch.nn.Parameter):  # modules need Parameters back, not tensors
                    return (torch.nn.Parameter, (cpu.as_subclass(torch.Tensor), obj.requires_grad))
                if cpu.device.type != "cpu":  # a subclass that keeps claiming a device: keep the data
                    cpu = cpu.as_subclass(torch.Tensor)
                return (_identity, (cpu,))
            return super().reducer_override(obj)

    return ToCPUPickler


def segment_reduction(storages: dict, obj, torch):
    """How a big plain CPU tensor, or a storage, pickles with its bytes out of band (result_segments.py); None
    for anything else. ``storages``: the pickler's own, one object per storage, so that pickle's memo shares it
    (views and tied weights keep sharing one storage)."""
    if isinstance(obj, torch.UntypedStorage):
        return result_segments.reduce_storage(obj)
    if not _plain_cpu_tensor(obj, torch):
        return None
    storage = obj.untyped_storage()
    storage = storages.setdefault((storage.data_ptr(), storage.nbytes()), storage)
    layout = (obj.dtype, obj.storage_offset(), tuple(obj.size()), obj.stride(), obj.requires_grad)
    return (result_segments.rebuild_tensor, (storage, *layout, isinstance(obj, torch.nn.Parameter)))


def _plain_cpu_tensor(obj, torch) -> bool:
    """A CPU tensor whose storage bytes and layout say all of it (no subclass, attributes, conj/neg bits)."""
    return (
        type(obj) in (torch.Tensor, torch.nn.Parameter)
        and obj.device.type == "cpu"
        and obj.layout == torch.strided
        and not (obj.is_quantized or obj.is_nested or obj.is_conj() or obj.is_neg())
        and not getattr(obj, "__dict__", None)
        and obj.untyped_storage().nbytes() >= result_segments.SEGMENT_MIN_BYTES
    )


def dumps_result(value, segments: str = "", rank: int = 0) -> bytes:
    """Pickle a return value with every tensor on CPU, so the kernel never initializes CUDA receiving it.

    ``segments``: the launch's shared-memory folder (result_segments.py), where the big buffers go; "" for none."""
    if segments:
        return result_segments.dumps_with_segments(value, segments, rank, _to_cpu_pickler(segments=True))
    buf = io.BytesIO()
    _to_cpu_pickler()(buf, protocol=5).dump(value)
    return buf.getvalue()


def unwrap_for_return(value):
    """A DDP-wrapped module comes back as the plain module."""
    mod = getattr(value, "module", None)
    if mod is not None and type(value).__name__ in ("DistributedDataParallel", "DataParallel"):
        return mod
    return value
