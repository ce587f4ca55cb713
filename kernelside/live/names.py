"""Which kernel names a live cell needs, and which of them the ranks do not have yet.

Names a ``%%distributed`` cell assigns belong to the ranks from then on. Every other name the cell
uses (and the names the notebook functions it calls use) comes from the kernel's current value,
sent with cloudpickle — unless the ranks already have that value: per name the kernel remembers a
fingerprint of what it last sent (fork: of what the ranks inherited). Tensors, functions, classes
and modules are recognised by identity (and a tensor's version counter, which every in-place
change bumps), held by weak reference so the kernel keeps nothing alive; other values by a digest
of their pickle. A 200 MB tensor used by 10 cells therefore crosses once.

Notebook functions travel as their code and are rebuilt on the rank with the rank's namespace as
globals (``worker.live_rank.rebuild_function``), so they see what the cells assigned there.

Example::

    >>> sender = NameSender()
    >>> sorted(sender.collect({"lr"}, {"lr": 0.1}))
    ['lr']
"""

from __future__ import annotations

import dis
import hashlib
import io
import sys
import types
import weakref

import cloudpickle

from ..errors import LaunchConfigError
from ..notebook.cell import names_used
from ..worker.live_rank import rebuild_function

# IPython's own names and the ones every rank defines for itself
NOT_SENT = frozenset(("In", "Out", "get_ipython", "exit", "quit", "rank", "local_rank", "world_size", "device"))
_BY_IDENTITY = (types.FunctionType, type, types.ModuleType, types.BuiltinFunctionType)


class _RankPickler(cloudpickle.Pickler):
    """cloudpickle, except that a notebook function is sent without its globals (see the module doc)."""

    def reducer_override(self, obj):
        if isinstance(obj, types.FunctionType) and obj.__module__ == "__main__":
            return rebuild_function, (
                obj.__code__,
                obj.__name__,
                obj.__defaults__,
                obj.__kwdefaults__,
                obj.__closure__,
                obj.__qualname__,
                obj.__doc__,
                dict(obj.__dict__),
            )
        return super().reducer_override(obj)


def dumps(value) -> bytes:
    """Pickle ``value`` for a live rank."""
    buf = io.BytesIO()
    _RankPickler(buf, protocol=5).dump(value)
    return buf.getvalue()


def names_assigned(source: str, filename: str) -> set[str]:
    """The global names a cell binds: top-level assignments, imports, defs, and ``global`` stores."""
    names: set[str] = set()

    def walk(code: types.CodeType, top: bool) -> None:
        for ins in dis.get_instructions(code):
            if ins.opname in ("STORE_GLOBAL", "DELETE_GLOBAL") or (top and ins.opname in ("STORE_NAME", "DELETE_NAME")):
                names.add(ins.argval)
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                walk(const, False)

    walk(compile(source, filename, "exec"), True)
    return names


def _identity_key(value):
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return ("tensor", id(value), value._version)
    if isinstance(value, _BY_IDENTITY):
        return ("object", id(value))
    return None


def _weak(value):
    try:
        return weakref.ref(value)
    except TypeError:
        return None


def _code_names(fn, kernel_ns: dict, seen: set[str]) -> None:
    """The globals a notebook function reads, and those of the notebook functions it calls, by name."""
    stack = [fn.__code__]
    while stack:
        code = stack.pop()
        for name in code.co_names:
            if name in seen or name not in kernel_ns:
                continue
            seen.add(name)
            value = kernel_ns[name]
            if isinstance(value, types.FunctionType) and value.__module__ == "__main__":
                stack.append(value.__code__)
        stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))


def needed_names(source: str, filename: str, kernel_ns: dict) -> set[str]:
    """Every kernel name a cell may read, directly or through the notebook functions it calls."""
    seen = {n for n in names_used(source, filename) if n in kernel_ns}
    for name in list(seen):
        value = kernel_ns[name]
        if isinstance(value, types.FunctionType) and value.__module__ == "__main__":
            _code_names(value, kernel_ns, seen)
    return seen


class NameSender:
    """What the ranks already have of the kernel's names; what a request must carry."""

    def __init__(self):
        self.known: dict[str, tuple] = {}  # name -> (fingerprint, weak reference or None)
        self.owned: set[str] = set()  # names the cells assigned: the ranks' own
        self.names_bytes = 0  # pickled kernel values sent so far (each value counted once, not per rank)

    def seed(self, kernel_ns: dict) -> None:
        """Forked ranks start with the kernel's namespace: what is recognisable by identity is known."""
        for name, value in list(kernel_ns.items()):
            key = _identity_key(value)
            if key is not None:
                self.known[name] = (key, _weak(value))

    def collect(self, names, kernel_ns: dict, *, force: bool = False) -> dict[str, tuple]:
        """``{name: (blob, fingerprint, weakref)}`` for the names whose kernel value the ranks lack.

        Raises LaunchConfigError naming every value that cannot be pickled (nothing is sent then).
        """
        out, problems = {}, []
        for name in sorted(names):
            if name.startswith("__") or name in NOT_SENT or name not in kernel_ns:
                continue
            if name in self.owned and not force:
                continue
            value = kernel_ns[name]
            key, blob = _identity_key(value), None
            try:
                if key is None:
                    blob = dumps(value)
                    key = ("pickle", hashlib.blake2b(blob, digest_size=16).digest())
                prev = self.known.get(name)
                ref = _weak(value) if key[0] != "pickle" else None
                if not force and prev is not None and prev[0] == key and (prev[1] is None or prev[1]() is value):
                    continue
                out[name] = (blob if blob is not None else dumps(value), key, ref)
            except Exception as e:
                problems.append(f"{name!r} ({type(value).__name__}): {type(e).__name__}: {e}")
        if problems:
            raise LaunchConfigError(
                None,
                None,
                None,
                message="these notebook names cannot be sent to the live ranks: "
                + "; ".join(problems)
                + ". Create them inside a %%distributed cell instead (the ranks keep them), "
                "or make them picklable. Nothing ran.",
            )
        return out

    def sent(self, values: dict[str, tuple], assigned=()) -> None:
        """The request carrying ``values`` reached every rank: remember what they now have."""
        for name, (blob, key, ref) in values.items():
            self.known[name] = (key, ref)
            self.names_bytes += len(blob)
        self.owned.update(assigned)
