"""Sharded return values come back whole: FSDP modules, DTensors, and containers holding them.

A rank holds only its shard of an FSDP model or a DTensor; pickling it as it is would send a shard
that looks like the whole (or fail on a process group). ``gather_for_return()`` runs on every rank
between the launched code's return and rank 0 sending its value. It is a collective:

1. *find* (local): walk the value (dicts, lists, tuples, modules, optimizers, plain objects) and
   list the gathers it needs, in traversal order — one per DTensor, one per module tree holding
   FSDP1 units. What cannot be gathered (a tensor-parallel module, an FSDP1 flat parameter on
   its own) is an error naming where it sits and what to return instead.
2. *agree* (through the process group's store, so a rank still busy never trips a collective
   timeout; ``gather_agreement``): every rank's list is recorded there (by the kernel, for a rank
   holding nothing sharded whose store is the kernel's); unless all lists match, every rank that
   gathers raises, naming the first difference. Ranks not asked to return still take part.
3. *gather* (collective): parameter by parameter (``DTensor.full_tensor()``, FSDP1's full state
   dict unit by unit), straight to CPU, so no rank holds more than one full copy; only the ranks
   that return keep what they gather.
4. *rebuild* (local, returning ranks; ``sharded_rebuild.py``): the same structure with plain objects — an FSDP2 module
   as an instance of its original class with full ``nn.Parameter``s and FSDP's hooks and state
   removed, an FSDP1 wrapper as the module it wrapped, a DTensor as its full CPU tensor. The
   user's own objects are never modified (so live ranks keep training on them).

Example (inside a launched function)::

    >>> model = fully_shard(Net())                              # doctest: +SKIP
    >>> whole = gather_for_return({"model": model}, keep=rank == 0)
    >>> type(whole["model"]) is Net, whole["model"].fc.weight.shape
    (True, torch.Size([8, 4]))
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import os
import pickle
import types

from . import gather_agreement as agreement
from .cell_values import CellValues
from .shard_classes import torch_classes
from .sharded_rebuild import HOOK_DICTS, Rebuilder, hook_origin, rebuild_fsdp1

_ATOMIC = (int, float, complex, bool, str, bytes, bytearray, type(None), range, slice)
_ATOMIC_TYPES = frozenset(_ATOMIC)
_AGREE_WAIT = datetime.timedelta(days=7)  # ranks wait for the slowest; a failed rank gets them stopped by the kernel


class ShardedResultError(RuntimeError):
    """A sharded return value that cannot come back whole: what, where, and what to return instead."""


@dataclasses.dataclass
class _Gather:
    kind: str  # "dtensor" | "fsdp1"
    obj: object
    path: str
    meta: tuple  # what must match on every rank: shape and dtype, or the FSDP1 units


# -- 1. find -------------------------------------------------------------------------------------------


class _Finder:
    """Walks a value in a fixed order; lists the gathers and marks every object on a path to one."""

    def __init__(self, classes: dict):
        import torch

        self.torch = torch
        self.cls = classes
        self.gathers: list[_Gather] = []
        self.seen: set[int] = set()
        self.marked: set[int] = set()  # ids of containers that hold something gathered
        self.stack: list[int] = []
        self.parents: dict[int, set[int]] = {}  # object -> the containers it was reached from (shared objects too)

    def _found(self, kind: str, obj, path: str, meta: tuple) -> None:
        self.gathers.append(_Gather(kind, obj, path, meta))
        self.marked.update(self.stack)

    def visit(self, obj, path: str) -> None:
        if isinstance(obj, _ATOMIC):
            return
        if self.stack:
            self.parents.setdefault(id(obj), set()).add(self.stack[-1])
        if id(obj) in self.seen:
            return  # walked already; if it holds something gathered, mark_paths() marks this parent too
        torch = self.torch
        if "dtensor" in self.cls and isinstance(obj, self.cls["dtensor"]):
            self.seen.add(id(obj))
            self._found("dtensor", obj, path, (tuple(obj.shape), str(obj.dtype)))
            return
        if "flat" in self.cls and isinstance(obj, self.cls["flat"]):
            raise ShardedResultError(
                f"{path} is an FSDP1 flat parameter: rank-local shards of several parameters flattened together, "
                "which cannot be gathered on their own. Return the FSDP model itself (it comes back whole), or for "
                "an optimizer FullyShardedDataParallel.optim_state_dict(model, optimizer)."
            )
        if isinstance(obj, torch.Tensor) or isinstance(obj, (types.ModuleType, type, types.FunctionType)):
            return
        self.seen.add(id(obj))
        self.stack.append(id(obj))
        try:
            if isinstance(obj, torch.nn.Module):
                self._module(obj, path)
            elif isinstance(obj, dict):
                for k, v in list(obj.items()):
                    if type(k) not in _ATOMIC_TYPES:
                        self.visit(k, f"{path}[{k!r}] (key)")
                    if type(v) not in _ATOMIC_TYPES:  # a list of a million floats is walked in milliseconds
                        self.visit(v, f"{path}[{k!r}]")
            elif isinstance(obj, (list, tuple)):
                for i, v in enumerate(obj):
                    if type(v) not in _ATOMIC_TYPES:
                        self.visit(v, f"{path}[{i}]")
            elif isinstance(obj, torch.optim.Optimizer):
                self.visit(obj.__dict__.get("state"), f"{path}.state")
                self.visit(obj.__dict__.get("param_groups"), f"{path}.param_groups")
            elif _plain_object(obj):
                for k, v in list(vars(obj).items()):
                    self.visit(v, f"{path}.{k}")
        finally:
            self.stack.pop()

    def mark_paths(self) -> None:
        """Mark every container above something gathered, whichever parent reached a shared object first."""
        todo = [id(g.obj) for g in self.gathers] + list(self.marked)
        while todo:
            for parent in self.parents.get(todo.pop(), ()):
                if parent not in self.marked:
                    self.marked.add(parent)
                    todo.append(parent)

    def _module(self, m, path: str) -> None:
        if "fsdp1" in self.cls:
            units = [u for u in m.modules() if isinstance(u, self.cls["fsdp1"])]
            if units:
                for sub in m.modules():
                    self.seen.add(id(sub))
                self._found("fsdp1", m, path, (type(m).__qualname__, len(units)))
                return
        self._module_tree(m, path)

    def _module_tree(self, m, path: str) -> None:
        before = len(self.gathers)
        for group in ("_parameters", "_buffers"):
            for name, t in m.__dict__.get(group, {}).items():
                self.visit(t, f"{path}.{name}")
        for name, v in list(m.__dict__.items()):
            if not name.startswith("_") and not isinstance(v, _ATOMIC):
                self.visit(v, f"{path}.{name}")
        for name, child in m.__dict__.get("_modules", {}).items():
            if child is not None:
                self.parents.setdefault(id(child), set()).add(id(m))
            if child is not None and id(child) not in self.seen:
                self.seen.add(id(child))
                self.stack.append(id(child))
                try:
                    self._module_tree(child, f"{path}.{name}")
                finally:
                    self.stack.pop()
        if len(self.gathers) > before or ("fsdp2" in self.cls and isinstance(m, self.cls["fsdp2"])):
            self.marked.update(self.stack)
            self._refuse_mesh_hooks(m, path)

    def _refuse_mesh_hooks(self, m, path: str) -> None:
        """Hooks that redistribute over a device mesh (tensor parallelism) would break the plain module."""
        mesh = self.cls.get("mesh")
        for attr in HOOK_DICTS:
            for fn in m.__dict__.get(attr, {}).values():
                origin = hook_origin(fn)
                if origin.startswith("torch.distributed.fsdp"):
                    continue  # FSDP's own: removed when the module is rebuilt
                if mesh is not None and _refers_to(fn, mesh):
                    raise ShardedResultError(
                        f"{path} ({type(m).__name__}) is tensor-parallel (a hook from {origin} redistributes its "
                        "inputs or outputs over a device mesh), which nblaunch cannot turn back into a plain module: "
                        f"its code may expect the local shapes. Return its state dict instead ({path}.state_dict(), or "
                        "get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))): every DTensor "
                        "in it comes back as the full tensor."
                    )


def _plain_object(obj) -> bool:
    """An instance that pickles as its ``__dict__`` (a user class, a dataclass), so walking it is what pickle sees."""
    cls = type(obj)
    return (
        hasattr(obj, "__dict__")
        and cls.__reduce_ex__ is object.__reduce_ex__
        and cls.__reduce__ is object.__reduce__
        and not cls.__module__.startswith(("torch._C", "builtins"))
    )


def _refers_to(fn, cls) -> bool:
    """Whether a hook closes over (or is bound to, or is a partial of) an instance of ``cls``."""
    values = []
    if isinstance(fn, functools.partial):
        values += [*fn.args, *fn.keywords.values()]
        fn = fn.func
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            values.append(cell.cell_contents)
        except ValueError:
            pass
    values.append(getattr(fn, "__self__", None))
    return any(isinstance(v, cls) for v in values)


# -- 2. agree ------------------------------------------------------------------------------------------


def _describe(entry) -> str:
    if entry is None:
        return "nothing sharded there"
    kind, meta, path = entry
    if kind == "dtensor":
        return f"a DTensor of shape {list(meta[0])} ({meta[1]}) at {path}"
    return f"an FSDP1 model ({meta[0]}, {meta[1]} FSDP units) at {path}"


def _store(dist, relay: bool):
    """(The store the records go to, whether the kernel writes those of ranks holding nothing sharded): the default
    group's store (None: another kind of process group, no check), or, relayed, the rendezvous store under it when
    that is the kernel's (not when the user's code made the group on a store of its own)."""
    try:
        store = dist.distributed_c10d._get_default_store()
    except Exception:
        return None, False
    if relay:
        base = store
        while isinstance(base, dist.PrefixStore):
            base = base.underlying_store
        if str(getattr(base, "port", "")) == os.environ.get("MASTER_PORT"):
            return base, True
    return store, False


def _post(dist, gathers: list[_Gather], keep: bool, run: str, relay: bool, left: bool = False):
    """This rank's record (``gather_agreement``), written unless the kernel writes it; returns the store, or None
    when there is no store to agree through."""
    store, relayed = _store(dist, relay)
    if store is None:
        return None
    if gathers or left or not relayed:  # relayed and nothing sharded: the kernel writes it if a peer gathers
        sharded = [(g.kind, g.meta) for g in gathers]
        store.set(agreement.key(run, dist.get_rank()), agreement.record(sharded, [g.path for g in gathers], keep, left))
    return store


def _agree(dist, gathers: list[_Gather], keep: bool, run: str, relay: bool) -> set[int]:
    """Every rank's list of gathers must match; returns the ranks that keep the result.

    Only a rank with something to gather waits for the others' records: a run with nothing sharded never
    waits here (so a rank that is slow, or ends by ``os._exit``, costs nothing), and a rank that gathers
    always learns what its peers hold before the first collective.
    """
    store = _post(dist, gathers, keep, run, relay)
    if store is None or not gathers:
        return {dist.get_rank()} if keep else set()
    keys = [agreement.key(run, r) for r in range(dist.get_world_size())]
    store.wait(keys, _AGREE_WAIT)
    lists = [pickle.loads(b) for b in store.multi_get(keys)]
    mine = lists[dist.get_rank()]
    for r, other in enumerate(lists):
        if other[0] == mine[0]:
            continue
        if other[3]:
            raise ShardedResultError(
                f"rank {r} ended (sys.exit) before the sharded return value could be gathered, so "
                f"{gathers[0].path} cannot come back whole: let every rank reach the end of the launched code."
            )
        i = next((i for i, (a, b) in enumerate(zip(mine[0], other[0], strict=False)) if a != b), None)
        i = min(len(mine[0]), len(other[0])) if i is None else i
        here, there = ((*e[0][i], e[1][i]) if i < len(e[0]) else None for e in (mine, other))
        raise ShardedResultError(
            f"the ranks return different sharded values: rank {dist.get_rank()} returns {_describe(here)} where rank "
            f"{r} returns {_describe(there)}. Sharded objects are gathered by every rank together, so every rank must "
            "return the same ones (nblaunch sends rank 0's): return them on every rank, not only on rank 0."
        )
    return {r for r, other in enumerate(lists) if other[2]}


def leave(run: str = agreement.RUN, relay: bool = False) -> None:
    """A rank that ends without reaching ``gather_for_return`` (``sys.exit``) says so, so no peer waits for it."""
    try:
        import torch.distributed as dist

        if dist.is_initialized() and dist.get_world_size() > 1:
            _post(dist, [], keep=False, run=run, relay=relay, left=True)
    except Exception:
        pass  # the rank is leaving anyway; a peer that gathers then fails on the missing rank's exit


# -- 3. gather -----------------------------------------------------------------------------------------


def _full_dtensor(dt, keep: bool):
    import torch

    if dt.device_mesh.get_coordinate() is None:  # this rank holds no part of it and takes no part in its gather
        if keep:
            raise ShardedResultError(
                "a returned DTensor lives on a device mesh without this rank, which holds none of it: return it "
                "from a rank of its mesh (--return-from / return_all)."
            )
        return None
    with torch.no_grad():
        full = dt.full_tensor()
        if not keep:
            return None
        cpu = full.detach().to("cpu")
    del full  # the device copy goes at once: one full parameter at a time on the device
    if isinstance(dt, torch.nn.Parameter):
        return torch.nn.Parameter(cpu, requires_grad=dt.requires_grad)
    return cpu


def _fsdp1_state_dict(top, rank0_only: bool) -> dict:
    from torch.distributed.fsdp import FullStateDictConfig, StateDictType
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    unit = next(u for u in top.modules() if isinstance(u, FSDP))
    # On CPU, FSDP1's offload fails (it frees the very storage it copies from); its clones are on CPU already.
    on_cpu = getattr(unit, "compute_device", None) is None or unit.compute_device.type == "cpu"
    config = FullStateDictConfig(offload_to_cpu=not on_cpu, rank0_only=rank0_only)
    with FSDP.state_dict_type(top, StateDictType.FULL_STATE_DICT, config):
        return top.state_dict()


# -- the entry point -----------------------------------------------------------------------------------


def _roots(value) -> tuple[list[int], list[tuple[object, str]]]:
    """(containers, named roots): a %%distributed cell's values are named as the user knows it, by the
    cell's result and the --return names."""
    if isinstance(value, CellValues):
        return value.roots()
    return [id(value)], [(value, "result")]


def find_gathers(value) -> _Finder | None:
    """Step 1: what ``value`` holds sharded (None when nothing can be: no module of sharded classes is loaded)."""
    classes = torch_classes()
    if "dtensor" not in classes and "fsdp1" not in classes:  # neither ever imported here: nothing here is sharded
        return None
    finder = _Finder(classes)
    finder.stack, named = _roots(value)
    for obj, name in named:
        finder.visit(obj, name)
    finder.mark_paths()
    return finder


def gather_for_return(value, *, keep: bool, run: str = agreement.RUN, relay: bool = False, found=False):
    """Make ``value`` whole on the ranks that ``keep`` it (None elsewhere). Every rank must call it. ``run``: the
    same on every rank of the run (``gather_agreement``); ``relay``: the kernel writes the record of a rank holding
    nothing sharded; ``found``: ``find_gathers(value)``, when the caller has it already.

    Example::

        >>> value = gather_for_return(model, keep=(rank == 0))    # doctest: +SKIP
    """
    import torch.distributed as dist

    finder = find_gathers(value) if found is False else found
    gathers: list[_Gather] = finder.gathers if finder is not None else []
    if not dist.is_available() or not dist.is_initialized():
        if gathers:
            raise ShardedResultError(
                f"{gathers[0].path} is sharded, but the process group was destroyed before the return value "
                "could be gathered. Leave destroy_process_group() to nblaunch (it runs after the gather)."
            )
        return value if keep else None
    keepers = _agree(dist, gathers, keep, run, relay) if dist.get_world_size() > 1 else {0}
    if not gathers:
        return value if keep else None
    classes = finder.cls
    gathered: dict[int, object] = {}
    for g in finder.gathers:
        if g.kind == "dtensor":
            full = _full_dtensor(g.obj, keep)
        else:
            sd = _fsdp1_state_dict(g.obj, rank0_only=keepers <= {0})
            full = rebuild_fsdp1(g.obj, sd, classes) if keep else None
            del sd
        if keep:
            gathered[id(g.obj)] = full
    if not keep:
        return None
    return Rebuilder(gathered, finder.marked, classes)(value)
