"""Step 4 of ``sharded_results``: the returned structure again, with plain objects where shards were.

Runs on the ranks that return, after the gather, without collectives. ``Rebuilder`` copies only the
containers on a path to something gathered (everything else is the user's own object, shared, not
copied): an FSDP2 module becomes an instance of its original class (not FSDP's dynamic subclass) with
the gathered ``nn.Parameter``s, FSDP's hooks and composable state removed; ``rebuild_fsdp1`` turns an
FSDP1 tree into the modules it wraps, with the parameters of its full state dict. The user's objects
are never modified.

Example::

    >>> plain = Rebuilder({id(dtensor): full}, marked={id(container)}, cls=classes)(container)  # doctest: +SKIP
"""

from __future__ import annotations

import copy
import functools
import types

HOOK_DICTS = (
    "_forward_pre_hooks",
    "_forward_hooks",
    "_backward_pre_hooks",
    "_backward_hooks",
    "_state_dict_pre_hooks",
    "_state_dict_hooks",
    "_load_state_dict_pre_hooks",
    "_load_state_dict_post_hooks",
)
_HOOK_FLAGS = ("_forward_pre_hooks_with_kwargs", "_forward_hooks_with_kwargs", "_forward_hooks_always_called")
_FSDP_ATTRS = ("_is_fsdp_managed_module", "_fsdp_use_orig_params")


def hook_origin(fn) -> str:
    """The module a module hook's code comes from, through partials, bound methods and torch's wrappers."""
    while True:
        if isinstance(fn, functools.partial):
            fn = fn.func
        elif hasattr(fn, "hook") and not isinstance(fn, types.FunctionType):  # torch's _WrappedHook
            fn = fn.hook
        elif isinstance(fn, types.MethodType):
            fn = fn.__func__
        else:
            return getattr(fn, "__module__", None) or ""


class Rebuilder:
    """``rebuilder(value)``: ``value`` with gathered objects replaced and the containers above them copied."""

    def __init__(self, gathered: dict[int, object], marked: set[int], cls: dict):
        import torch

        self.torch = torch
        self.gathered = gathered
        self.marked = marked
        self.cls = cls
        self.done: dict[int, object] = {}

    def __call__(self, obj):
        key = id(obj)
        if key in self.gathered:
            return self.gathered[key]
        if key not in self.marked:
            return obj
        if key in self.done:
            return self.done[key]
        torch = self.torch
        if isinstance(obj, torch.nn.Module):
            return self._module(obj)
        if isinstance(obj, dict):
            new = copy.copy(obj)
            self.done[key] = new
            new.clear()
            for k, v in obj.items():
                new[self(k)] = self(v)
            return new
        if isinstance(obj, list):
            new = copy.copy(obj)
            self.done[key] = new
            new[:] = [self(v) for v in obj]
            return new
        if isinstance(obj, tuple):
            items = [self(v) for v in obj]
            new = type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
            self.done[key] = new
            return new
        new = copy.copy(obj)  # an optimizer or plain object: its class's own copy protocol, then the attributes
        self.done[key] = new
        for k, v in list(vars(obj).items()):
            if id(v) in self.marked or id(v) in self.gathered:
                vars(new)[k] = self(v)
        return new

    def _module(self, m):
        cls = type(m)
        if "fsdp2" in self.cls and issubclass(cls, self.cls["fsdp2"]):
            cls = next(b for b in cls.__bases__ if not issubclass(b, self.cls["fsdp2"]))  # FSDP's dynamic subclass
        new = cls.__new__(cls)
        self.done[id(m)] = new
        state = {k: v for k, v in m.__dict__.items() if not k.startswith("__composable_api_") and k not in _FSDP_ATTRS}
        state["_parameters"] = {k: self(v) for k, v in m._parameters.items()}
        state["_buffers"] = {k: self(v) for k, v in m._buffers.items()}
        state["_modules"] = {k: (self(v) if v is not None else None) for k, v in m._modules.items()}
        _drop_fsdp_hooks(state)
        for k, v in list(state.items()):
            if not k.startswith("_") and (id(v) in self.marked or id(v) in self.gathered):
                state[k] = self(v)
        new.__dict__.update(state)
        return new


def _drop_fsdp_hooks(state: dict) -> None:
    dropped = set()
    for attr in HOOK_DICTS:
        if attr in state:
            kept = type(state[attr])()
            for hid, fn in state[attr].items():
                if hook_origin(fn).startswith("torch.distributed.fsdp"):
                    dropped.add(hid)
                else:
                    kept[hid] = fn
            state[attr] = kept
    for attr in _HOOK_FLAGS:
        if attr in state:
            state[attr] = type(state[attr])((k, v) for k, v in state[attr].items() if k not in dropped)


def rebuild_fsdp1(top, sd: dict, cls: dict):
    """The module tree without FSDP1 wrappers, its parameters from the full state dict (clean names)."""
    import torch

    fsdp, flat_cls = cls["fsdp1"], cls["flat"]
    wrapper_names = ("_fsdp_wrapped_module", "_checkpoint_wrapped_module")
    owners: dict[int, dict[str, bool]] = {}  # module -> {original parameter name: requires_grad}
    shared = []
    for unit in top.modules():
        handle = getattr(unit, "_handle", None) if isinstance(unit, fsdp) else None
        if handle is not None:
            flat = handle.flat_param
            for info in flat._param_infos:
                owners.setdefault(id(info.module), {})[info.param_name] = flat.requires_grad
            shared += list(flat._shared_param_infos)
    new_of: dict[int, object] = {}

    def plain(m, prefix: str):
        if isinstance(m, fsdp):
            return plain(m._fsdp_wrapped_module, prefix)
        new = type(m).__new__(type(m))
        new_of[id(m)] = new
        state = dict(m.__dict__)
        params = {k: v for k, v in m._parameters.items() if not isinstance(v, flat_cls)}
        for name, requires_grad in owners.get(id(m), {}).items():
            full = sd.get(prefix + name)
            if full is not None:
                params[name] = torch.nn.Parameter(full, requires_grad=requires_grad)
                state.pop(name, None)  # the rank-local view FSDP1 set as a plain attribute
        state["_parameters"] = params
        state["_buffers"] = {k: sd.get(prefix + k, v) for k, v in m._buffers.items()}
        state["_modules"] = {
            k: (plain(v, prefix if k in wrapper_names else f"{prefix}{k}.") if v is not None else None)
            for k, v in m._modules.items()
        }
        new.__dict__.update(state)
        return new

    root = plain(top, "")
    for info in shared:  # tied weights stay tied
        owner, prim = new_of.get(id(info.module)), new_of.get(id(info.prim_module))
        if owner is not None and prim is not None and info.prim_param_name in prim._parameters:
            owner._parameters[info.param_name] = prim._parameters[info.prim_param_name]
            owner.__dict__.pop(info.param_name, None)
    return root
