"""The live transport of notebook names: which of the names a request needs the ranks lack, packed once.

Which names a cell or function needs is decided in ``launch.payload`` (the same analysis as a
one-shot launch and export). Names a ``%%distributed`` cell assigns belong to the ranks from then on.
Every other name it uses comes from the kernel's current value, sent with cloudpickle — unless the
ranks already have that value: per name the kernel remembers a fingerprint of what it last sent
(fork: of what the ranks inherited). The fingerprint is as cheap as is sound, and never needs the
value pickled when it did not change:

- tensors, functions, classes and modules: identity (held by weak reference, so the kernel keeps
  nothing alive), and a tensor's version counter, which every in-place change bumps;
- numpy arrays of plain data: identity, shape, dtype and a digest of their bytes, read in place;
- numbers, strings, bytes, None: the value itself (compared by equality; long strings by digest);
- anything else: a digest of its pickle (the only sound test for an arbitrary object).

A 200 MB tensor used by 10 cells therefore crosses once, and is pickled once.

Notebook functions travel as their code and are rebuilt on the rank with the rank's namespace as
globals (``worker.live_rank.rebuild_function``), so they see what the cells assigned there.

Example::

    >>> sender = NameSender()
    >>> sorted(sender.collect({"lr"}, {"lr": 0.1}))
    ['lr']
"""

from __future__ import annotations

import hashlib
import io
import sys
import types
import weakref

import cloudpickle

from ..errors import LaunchConfigError
from ..launch.payload import cell_needs, function_needs, is_notebook_name, names_assigned, unpicklable_names
from ..worker.live_rank import rebuild_function

_BY_IDENTITY = (types.FunctionType, type, types.ModuleType, types.BuiltinFunctionType)
_BY_VALUE = (bool, int, type(None))
_BY_REPR = (float, complex)  # by repr: 0.0 == -0.0 and nan != nan, but their reprs tell them apart
_SMALL = 4096  # strings and bytes up to this length are their own fingerprint; longer ones a digest


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


def _cheap_key(value):
    """A fingerprint that needs no pickling, or None (then only a digest of the pickle will do)."""
    if type(value) in _BY_VALUE:
        return ("value", type(value), value)
    if type(value) in _BY_REPR:
        return ("value", type(value), repr(value))
    if type(value) in (str, bytes):
        if len(value) <= _SMALL:
            return ("value", type(value), value)
        data = value.encode("utf-8", "surrogatepass") if isinstance(value, str) else value
        return ("value", type(value), hashlib.blake2b(data, digest_size=16).digest())
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return ("tensor", id(value), value._version)
    if isinstance(value, _BY_IDENTITY):
        return ("object", id(value))
    numpy = sys.modules.get("numpy")
    if numpy is not None and type(value) is numpy.ndarray and not value.dtype.hasobject:
        data = numpy.ascontiguousarray(value).view(numpy.uint8).reshape(-1)  # a copy only when not contiguous
        # SHA-1 is not for security here, only to notice a change; where the CPU has SHA instructions it reads
        # 2-3x faster than blake2b, and this runs for every cell that uses the array
        digest = hashlib.sha1(memoryview(data), usedforsecurity=False).digest()
        return ("ndarray", id(value), value.shape, value.dtype.str, digest)
    return None


def _weak(value):
    try:
        return weakref.ref(value)
    except TypeError:
        return None


class NameSender:
    """What the ranks already have of the kernel's names; what a request must carry."""

    def __init__(self):
        self.known: dict[str, tuple] = {}  # name -> (fingerprint, weak reference or None)
        self.owned: set[str] = set()  # names the cells assigned: the ranks' own
        self.names_bytes = 0  # pickled kernel values sent so far (each value counted once, not per rank)

    @classmethod
    def for_new_ranks(cls, inherited: dict | None) -> NameSender:
        """What new ranks hold of the kernel's names: what they ``inherited`` (forked), else nothing."""
        sender = cls()
        if inherited is not None:
            sender.seed(inherited)
        return sender

    def seed(self, kernel_ns: dict) -> None:
        """Forked ranks start with the kernel's namespace: what is recognisable by identity is known."""
        for name, value in list(kernel_ns.items()):
            key = _cheap_key(value)
            if key is not None and key[0] in ("tensor", "object"):
                self.known[name] = (key, _weak(value))

    def for_cell(self, program, kernel_ns: dict) -> tuple[dict[str, tuple], set[str]]:
        """What a cell (``notebook.cell.CellProgram``) needs that the ranks lack (``collect()``'s answer), and the
        names it assigns (the ranks' own once it ran: give them to ``sent()``).

        Example::

            >>> values, assigned = session.names.for_cell(program, notebook_namespace())   # doctest: +SKIP
        """
        needed = cell_needs(program.source, program.filename, kernel_ns)
        return self.collect(needed, kernel_ns), names_assigned(program.source, program.filename)

    def for_function(self, fn, kernel_ns: dict) -> dict[str, tuple]:
        """What a notebook function needs (it runs with each rank's namespace as globals) that the ranks lack.

        Example::

            >>> values = session.names.for_function(train, notebook_namespace())   # doctest: +SKIP
        """
        return self.collect(function_needs(fn, kernel_ns), kernel_ns)

    def for_push(self, names, source: dict, *, given: bool) -> tuple[dict[str, tuple], tuple[str, ...]]:
        """``%distributed_push``: these values as they are now, even if unchanged; values the caller ``given``
        (not the notebook's) become the ranks' own (the second item: give it to ``sent()``)."""
        missing = [n for n in names if n not in source]
        if missing:
            raise LaunchConfigError(
                "%distributed_push", ",".join(missing), None, message=f"not defined in the notebook: {missing}"
            )
        values = self.collect(names, source, force=True)
        if not given:
            return values, ()
        values = {k: (blob, ("pushed",), None) for k, (blob, _key, _ref) in values.items()}
        return values, tuple(values)

    def collect(self, names, kernel_ns: dict, *, force: bool = False) -> dict[str, tuple]:
        """``{name: (blob, fingerprint, weakref)}`` for the names whose kernel value the ranks lack.

        Raises LaunchConfigError naming every value that cannot be pickled (nothing is sent then).
        """
        out, problems = {}, []
        for name in sorted(names):
            if not is_notebook_name(name) or name not in kernel_ns:
                continue
            if name in self.owned and not force:
                continue
            value = kernel_ns[name]
            blob = None
            try:
                key = _cheap_key(value)
                if key is None:
                    blob = dumps(value)
                    key = ("pickle", hashlib.blake2b(blob, digest_size=16).digest())
                prev = self.known.get(name)
                ref = _weak(value) if key[0] in ("tensor", "object", "ndarray") else None
                if not force and prev is not None and prev[0] == key and (prev[1] is None or prev[1]() is value):
                    continue
                out[name] = (blob if blob is not None else dumps(value), key, ref)
            except Exception as e:
                problems.append(f"{name!r} ({type(value).__name__}): {type(e).__name__}: {e}")
        if problems:
            raise unpicklable_names(
                problems,
                "the live ranks",
                "Create them inside a %%distributed cell instead (the ranks keep them), or make them picklable. "
                "Nothing ran.",
            )
        return out

    def sent(self, values: dict[str, tuple], assigned=()) -> None:
        """The request carrying ``values`` reached every rank: remember what they now have."""
        for name, (blob, key, ref) in values.items():
            self.known[name] = (key, ref)
            self.names_bytes += len(blob)
        self.owned.update(assigned)
