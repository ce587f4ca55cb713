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

A 200 MB tensor used by 10 cells therefore crosses once, and is pickled once. A big one (tensor storages
and numpy buffers of ``SEGMENT_MIN_BYTES`` or more, in whatever value holds them) crosses through shared
memory, as big return values come back (``worker.result_segments``): the kernel writes its buffers once into
a segment file in the session's folder, every rank maps it copy-on-write (its changes stay its own), and the
kernel takes the file away when the request ends, however it ended. A value that does not fit in the free
shared memory goes through the pipes, and the cell says so.

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
import os
import pickle
import sys
import types
import weakref

import cloudpickle

from ..errors import LaunchConfigError
from ..launch.payload import cell_needs, function_needs, is_notebook_name, names_assigned, unpicklable_names
from ..worker.live_rank import rebuild_function
from ..worker.result_segments import SEGMENT_MIN_BYTES, dumps_with_segments, header

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


class _SharedPickler(_RankPickler):
    """The same, with big tensor storages out of band (into the push's segment)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._storages: dict = {}

    def reducer_override(self, obj):
        torch = sys.modules.get("torch")
        if torch is not None:
            from ..worker.results import segment_reduction

            reduced = segment_reduction(self._storages, obj, torch)
            if reduced is not None:
                return reduced
        return super().reducer_override(obj)


def dumps(value) -> bytes:
    """Pickle ``value`` for a live rank (nblaunch's own plain data, a cell's program: plain pickle, a quarter of
    cloudpickle's cost)."""
    if getattr(value, "pickles_plainly", False):
        return pickle.dumps(value, protocol=5)
    buf = io.BytesIO()
    _RankPickler(buf, protocol=5).dump(value)
    return buf.getvalue()


def _big(value, blob: bytes | None) -> bool:
    """Worth a segment: a big tensor or array, or any value whose pickle is big (a dict of tensors, a model)."""
    if blob is not None:
        return len(blob) >= SEGMENT_MIN_BYTES
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return value.untyped_storage().nbytes() >= SEGMENT_MIN_BYTES
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(value, numpy.ndarray) and value.nbytes >= SEGMENT_MIN_BYTES


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
        self.shared_bytes = 0  # the part of them that crossed through shared memory, not the pipes
        self.folder: str | None = None  # the session's shared-memory folder (big values go there), None: pipes only
        self.segments: list[str] = []  # segment files made for the request being prepared (``drop_segments``)
        self.notes: list[str] = []  # values that went through the pipes instead, and why (``take_notes``)

    @classmethod
    def for_new_ranks(cls, inherited: dict | None, folder: str | None = None) -> NameSender:
        """What new ranks hold of the kernel's names: what they ``inherited`` (forked), else nothing; ``folder``:
        the world's shared-memory folder, where big values cross."""
        sender = cls()
        sender.folder = folder
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
        needed = cell_needs(program.source, kernel_ns)
        return self.collect(needed, kernel_ns), names_assigned(program.source)

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
                out[name] = (self._pack(name, value, blob), key, ref)
            except Exception as e:
                problems.append(f"{name!r} ({type(value).__name__}): {type(e).__name__}: {e}")
        if problems:
            self.drop_segments()
            raise unpicklable_names(
                problems,
                "the live ranks",
                "Create them inside a %%distributed cell instead (the ranks keep them), or make them picklable. "
                "Nothing ran.",
            )
        return out

    def _pack(self, name: str, value, blob: bytes | None) -> bytes:
        """What crosses to the ranks: big buffers in a segment of the session's folder, the rest in the pickle."""
        if self.folder is None or not _big(value, blob):
            return blob if blob is not None else dumps(value)
        body = dumps_with_segments(value, self.folder, "push", _SharedPickler)
        head = header(body)
        if head is not None and head[0]:
            self.segments.append(head[0])
        if head is not None and head[2]:
            self.notes.append(
                f"nblaunch: {name} ({head[2] / 2**20:.0f} MiB of it) went to the ranks through their pipes, not "
                f"shared memory: {head[3]}. Values this big cross faster with more free space in /dev/shm (a "
                "container's default is 64 MiB: `docker run --shm-size=8g`)."
            )
        return body

    def take_notes(self) -> list[str]:
        notes, self.notes = self.notes, []
        return notes

    def drop_segments(self) -> None:
        """The request is over (or never went): its segment files go; the ranks' mappings of them stay theirs."""
        for name in self.segments:
            try:
                os.unlink(os.path.join(self.folder, name))
            except OSError:
                pass  # (the world's folder went with a restart already)
        self.segments.clear()

    def rank_replaced(self) -> None:
        """A lost rank's replacement holds none of the kernel's values: each is sent again with the next request
        that needs it. The names the cells assigned stay the ranks' own (the ranks that stayed still hold them)."""
        self.known.clear()

    def sent(self, values: dict[str, tuple], assigned=()) -> None:
        """The request carrying ``values`` reached every rank: remember what they now have."""
        for name, (blob, key, ref) in values.items():
            self.known[name] = (key, ref)
            head = header(blob)
            shared = sum(n for _, n in head[1]) if head is not None else 0
            self.names_bytes += len(blob) + shared
            self.shared_bytes += shared
        self.owned.update(assigned)
