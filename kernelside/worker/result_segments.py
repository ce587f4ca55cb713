"""Large return values through shared memory: a rank writes the big buffers once, the kernel maps them.

A rank's return value used to travel whole through the rank's pipe: pickled in the rank, copied through
the pipe, reassembled and unpickled in the kernel (1.5-1.7x a pickle round trip of the same tensor). Now
the pickle carries the bytes of every tensor storage and numpy buffer of at least ``SEGMENT_MIN_BYTES``
out of band (pickle protocol 5): the rank writes them into one file in a private folder on a memory file
system (``/dev/shm``), and the pipe carries only the small pickle and where each buffer sits. The kernel
maps the file, takes its name away at once, and rebuilds tensors and arrays on the mapped memory without a
copy: the mapping is the kernel's one copy, freed when the last tensor on it goes.

- Tensors are rebuilt on the same storage layout (views, strides, tied weights sharing one storage stay so).
- A buffer that does not fit in what the memory file system has free (a container's 64 MiB ``/dev/shm``)
  goes through the pipe as before, and the cell says so once with what to do.
- The folder is the launch's (``SegmentFolder``, mode 0700 under ``/dev/shm/nblaunch-<uid>``): a rank that
  fails after writing leaves nothing, since the kernel removes the folder with what is left in it when the
  launch ends; folders of kernels that no longer run are removed by the next launch.

Example::

    >>> folder = SegmentFolder.create()               # kernel, before the ranks start      # doctest: +SKIP
    >>> body = dumps_with_segments(value, folder, 0, pickler)   # rank: big buffers in the folder  # doctest: +SKIP
    >>> received = Received.take(body, folder)         # kernel, as the result arrives      # doctest: +SKIP
    >>> received.loads()                               # the value, on the mapped memory    # doctest: +SKIP
"""

from __future__ import annotations

import mmap
import os
import pickle
import secrets
import shutil
import struct

from ..private_dir import OpenFolder, UnsafeFolderError, open_in, open_private_dir

SEGMENT_MIN_BYTES = 1 << 20  # smaller buffers stay in the pickle: a file and a mapping cost more than they save
# Linux's memory file system; where it is missing, results take the pipe. NBLAUNCH_SHM_DIR names another one
# (a bigger tmpfs where a container's /dev/shm is small).
SHM_ROOT_ENV = "NBLAUNCH_SHM_DIR"
SHM_ROOT_DEFAULT = "/dev/shm"
ALIGN = 64  # each buffer starts on a cache line (and any dtype's alignment)
FREE_MARGIN_BYTES = 64 << 20  # left free on the memory file system for everyone else
_MAGIC = b"NBLSEG1\n"  # a result body that starts so carries its segment's name and buffer table
_HEAD = struct.Struct("!I")
# the kernel maps the whole segment at once: faulting it in page by page as tensors are first read costs
# several times the copy that was saved
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


class SegmentFolder(OpenFolder):
    """A launch's private folder on the memory file system (kernel side); ``remove()`` ends it and what is in it."""

    @classmethod
    def create(cls, root: str | None = None) -> SegmentFolder | None:
        """A new folder, or None where there is no usable memory file system (results then take the pipe)."""
        root = root or os.environ.get(SHM_ROOT_ENV) or SHM_ROOT_DEFAULT
        if not os.path.isdir(root):
            return None
        base = os.path.join(root, f"nblaunch-{os.getuid()}")
        try:
            base_fd = open_private_dir(base, create=True)
        except (OSError, UnsafeFolderError):
            return None  # someone else's or an unsafe folder: nothing of ours goes there; the pipe still works
        try:
            _remove_abandoned(base, base_fd)
            name = f"{os.getpid()}-{secrets.token_hex(4)}"
            os.mkdir(name, 0o700, dir_fd=base_fd)
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=base_fd)
        except OSError:
            return None
        finally:
            os.close(base_fd)
        return cls(os.path.join(base, name), fd)

    def remove(self) -> None:
        """Remove the folder and any segment a rank wrote but the kernel never took (a rank failed)."""
        self.close()
        shutil.rmtree(self, ignore_errors=True)


def _remove_abandoned(base: str, base_fd: int) -> None:
    """Folders left by kernels that ended without removing theirs (killed): named after the kernel's pid."""
    for entry in os.listdir(base_fd):
        pid = entry.split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not os.path.exists(f"/proc/{pid}"):
            shutil.rmtree(os.path.join(base, entry), ignore_errors=True)


# -- the rank's side ---------------------------------------------------------------------------------


class _Sink:
    """One rank's segment file, written buffer by buffer as the pickler meets them."""

    def __init__(self, folder: str, owner: str):
        self.folder, self.name = folder, f"{owner}-{secrets.token_hex(4)}.seg"
        self.fd: int | None = None
        self.created = False  # the file exists (it is made at the first big buffer)
        self.size = 0
        self.table: list[tuple[int, int]] = []  # (offset, nbytes) of each out-of-band buffer, in pickle order
        self.fell_back = 0  # bytes that went in the pickle because the memory file system was full
        self.fell_back_reason = ""

    def keep(self, buf: pickle.PickleBuffer) -> bool:
        """pickle's buffer_callback: False puts the buffer out of band (here, in the segment)."""
        view = buf.raw()
        if view.nbytes < SEGMENT_MIN_BYTES:
            return True
        offset = -(-self.size // ALIGN) * ALIGN
        try:
            st = os.statvfs(self.folder)
            free = st.f_bavail * st.f_frsize - FREE_MARGIN_BYTES
            if view.nbytes > free:
                raise OSError(f"{self.folder} had {max(free, 0) / 2**20:.0f} MiB free beyond a 64 MiB margin")
            if self.fd is None:
                self.fd = open_in(self.folder, self.name, os.O_RDWR | os.O_CREAT | os.O_EXCL)
            written = 0
            while written < view.nbytes:
                written += os.pwrite(self.fd, view[written:], offset + written)
        except OSError as e:
            if self.fd is not None:
                os.ftruncate(self.fd, self.size)  # what this buffer wrote of itself is taken back
            self.fell_back += view.nbytes
            self.fell_back_reason = self.fell_back_reason or (e.strerror or str(e))
            return True
        self.table.append((offset, view.nbytes))
        self.size = offset + view.nbytes
        return False

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
            self.created = True

    def remove(self) -> None:
        """Take the segment file away (nothing in it will be sent)."""
        if self.created:
            os.unlink(os.path.join(self.folder, self.name))
            self.created = False


def dumps_with_segments(value, folder: str, rank: int | str, pickler_class) -> bytes:
    """Pickle ``value`` with ``pickler_class`` (protocol 5), its big buffers in a segment file in ``folder``
    (named after ``rank``, or the string given: the kernel's pushes are ``push``)."""
    import io

    sink = _Sink(folder, f"rank{rank}" if isinstance(rank, int) else rank)
    buf = io.BytesIO()
    try:
        pickler_class(buf, protocol=5, buffer_callback=sink.keep).dump(value)
    except BaseException:
        sink.close()
        sink.remove()
        raise
    sink.close()
    if not sink.table:
        sink.remove()  # every buffer fell back to the pickle: the kernel is sent no segment to take
    inner = buf.getvalue()
    if not sink.table and not sink.fell_back:
        return inner
    head = pickle.dumps((sink.name if sink.table else "", sink.table, sink.fell_back, sink.fell_back_reason))
    return _MAGIC + _HEAD.pack(len(head)) + head + inner


def reduce_storage(storage):
    """How a torch storage pickles here: its bytes as one buffer (out of band when big), rebuilt by the kernel."""
    import torch

    data = torch.empty(0, dtype=torch.uint8).set_(storage).numpy()
    return (_storage_from_buffer, (pickle.PickleBuffer(data),))


def _storage_from_buffer(buf):
    import torch

    if not len(memoryview(buf)):
        return torch.UntypedStorage(0)
    return torch.frombuffer(buf, dtype=torch.uint8).untyped_storage()


def rebuild_tensor(storage, dtype, offset: int, size: tuple, stride: tuple, requires_grad: bool, parameter: bool):
    """A tensor on ``storage`` with the layout it had in the rank."""
    import torch

    t = torch.empty(0, dtype=dtype).set_(storage, offset, size, stride)
    if parameter:
        return torch.nn.Parameter(t, requires_grad=requires_grad)
    return t.requires_grad_(requires_grad) if requires_grad else t


def header(body) -> tuple[str, list, int, str] | None:
    """(segment name, buffer table, bytes that fell back to the pickle, why) of a body with segments, or None."""
    view = memoryview(body)
    if view[: len(_MAGIC)] != _MAGIC:
        return None
    (n,) = _HEAD.unpack(view[len(_MAGIC) : len(_MAGIC) + _HEAD.size])
    at = len(_MAGIC) + _HEAD.size
    return pickle.loads(view[at : at + n])


def loads_shared(body, folder: str):
    """A body the kernel wrote for every rank (a push): its segment mapped copy-on-write, so each rank's changes
    stay its own and what no rank changes stays one copy in memory. The kernel removes the file after the request."""
    view = memoryview(body)
    head = header(view)
    if head is None:
        return pickle.loads(view)
    name, table, _, _ = head
    inner = _inner(view)
    if not name:
        return pickle.loads(inner)
    if not folder or os.path.basename(name) != name:
        raise ValueError(f"a pushed value names segment {name!r} outside this session's folder")
    fd = open_in(folder, name, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        # no MAP_POPULATE: on a private writable mapping Linux populates with write faults, which copies every page
        # into each rank (8 ranks: 8 copies of the value, and 0.5 s for a 256 MiB push); read faults share the pages
        segment = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    mv = memoryview(segment)
    return pickle.loads(inner, buffers=[mv[o : o + n] for o, n in table])


def _inner(view: memoryview) -> memoryview:
    (n,) = _HEAD.unpack(view[len(_MAGIC) : len(_MAGIC) + _HEAD.size])
    return view[len(_MAGIC) + _HEAD.size + n :]


# -- the kernel's side -------------------------------------------------------------------------------


class Received:
    """A result as it arrived: the pickle, and the mapped segment its big buffers sit in (if any)."""

    def __init__(self, body, segment: mmap.mmap | None, table: list[tuple[int, int]], fell_back=0, reason=""):
        self.body, self.segment, self.table = body, segment, table
        self.fell_back, self.fell_back_reason = fell_back, reason  # bytes that came in the pickle instead, and why

    @classmethod
    def take(cls, body, folder: SegmentFolder | None) -> Received:
        """Map the segment ``body`` names in ``folder`` (this launch's) and take its name away at once."""
        view = memoryview(body)
        if view[: len(_MAGIC)] != _MAGIC:
            return cls(body, None, [])
        at = len(_MAGIC)
        (n,) = _HEAD.unpack(view[at : at + _HEAD.size])
        at += _HEAD.size
        name, table, fell_back, reason = pickle.loads(view[at : at + n])
        inner = view[at + n :]
        if not name:
            return cls(inner, None, [], fell_back, reason)
        if folder is None or os.path.basename(name) != name:
            raise ValueError(f"a result names segment {name!r} outside this launch's folder")
        fd = open_in(folder, name, os.O_RDWR)
        try:
            if folder.fd is not None:
                os.unlink(name, dir_fd=folder.fd)
            else:
                os.unlink(os.path.join(folder, name))
            size = os.fstat(fd).st_size
            segment = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | _POPULATE) if size else None
        finally:
            os.close(fd)
        return cls(inner, segment, table, fell_back, reason)

    def fallback_note(self, rank: int) -> str | None:
        """What the cell says when some of rank ``rank``'s value came through the pipe instead (None if none did)."""
        if not self.fell_back:
            return None
        return (
            f"nblaunch: rank {rank}'s return value ({self.fell_back / 2**20:.0f} MiB of it) came through a pipe, not "
            f"shared memory: {self.fell_back_reason}. Results this big come back faster with more free space in "
            "/dev/shm (a container's default is 64 MiB: `docker run --shm-size=8g`)."
        )

    def loads(self):
        import cloudpickle

        if self.segment is None:
            return cloudpickle.loads(self.body)
        mv = memoryview(self.segment)
        return cloudpickle.loads(self.body, buffers=[mv[o : o + n] for o, n in self.table])
