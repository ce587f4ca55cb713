"""A live rank's way back from a collective that will never finish, with its namespace kept.

Facts of torch 2.13 this is built on: ``ProcessGroup.abort()`` / ``shutdown()`` do not unblock a
pending gloo collective, but shutting down the gloo pair sockets does (the blocked call raises
"Connection closed by peer" at once); a fresh ``init_process_group`` on a new store prefix then
works in the same processes; ``DistributedDataParallel._update_process_group`` re-points a model.
With three or more ranks, one rank's sockets reach only its ring neighbours, so the kernel tells
*every* rank to close its own (``abort``): each is read by the rank's request reader thread
(``worker.live_rank``), which runs while the main thread waits in C++ (gloo releases the GIL).

NCCL (by construction; the GPU kit's ``tests/gpu/test_gpu_live_recovery.py`` runs it): an NCCL
collective waits on the GPU, not on sockets. ``ProcessGroup.abort()`` is NCCL's communicator abort
(``ncclCommAbort``): the collective's kernels return, so a main thread blocked in ``barrier()``,
``.item()`` or ``synchronize()`` comes back (to the SIGINT the kernel sent first). torch says to use
it with ``TORCH_NCCL_ASYNC_ERROR_HANDLING=0``, or its watchdog may end the process on the aborted
work; a live rank sets that default (``worker.live_rank``). The rebuild then tears the aborted
groups down with ``_abort_process_group`` (``destroy_process_group`` would shut down communicators
that are gone) and makes the NCCL communicator at once, as the rank's start does. A rank that ran
ahead (NCCL collectives are asynchronous: its cell can end with a collective still on the GPU)
shows as ranks out of step, and its rebuild aborts that collective first.

The reader thread also says where the main thread is (``where``: the user's line and the collective
it waits in, read from the main thread's Python stack) and, when the main thread has waited in one
collective for ``WAIT_REPORT_S``, sends a ``waiting`` event: the kernel compares them across ranks
to name mismatched collectives (rank 0 in ``barrier``, rank 1 in ``all_reduce``) at once.

Example (in a rank)::

    >>> where_main()                                   # doctest: +SKIP
    {'line': 'cell In[4], line 5', 'collective': 'barrier', 'inside': None, 'seq': 7}
    >>> abort_group(inherited); rebuild_group(2, namespace)   # doctest: +SKIP
"""

from __future__ import annotations

import gc
import os
import socket
import sys
import threading

from ..rank_place import cell_place
from ..short_traceback import is_nblaunch_file
from . import group_owner
from .call_site import calling_of

PEER_LOSS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")  # gloo's words
WAIT_REPORT_S = 1.0  # a collective waited in this long is reported (mismatch detection)
_COLLECTIVE_FILES = ("distributed_c10d.py", "c10d_logger.py")
# the generation of the default group this process is on: 0, the one made at its start; ``rebuild_group``'s
# ``gen`` after it (said in ``where`` answers and ``idle`` events: ranks on different groups never meet)
group_generation = 0


def _main_frame():
    return sys._current_frames().get(threading.main_thread().ident)


def _seq() -> int | None:
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            return int(dist.distributed_c10d._get_default_group()._get_sequence_number_for_group())
    except Exception:
        return None
    return None


def where_main(frame=None, detail: bool = True) -> dict:
    """The main thread's user line (cell line, or file:line in function) and the collective it waits in;
    ``frame``: read from there instead (the frame a signal interrupted, given to its handler); ``detail``:
    also the torch function it is inside or the C function it calls when no collective is named (what a
    stopped rank's message says; the twice-a-second ``WaitWatch`` needs only the collective)."""
    frame = _main_frame() if frame is None else frame
    stack = []
    while frame is not None:
        stack.append(frame)
        frame = frame.f_back
    collective = None
    for f in stack:  # innermost first: the outermost torch.distributed function is the user's call
        name = os.path.basename(f.f_code.co_filename)
        if name in _COLLECTIVE_FILES and f.f_code.co_name not in ("wrapper", "_get_default_group"):
            collective = f.f_code.co_name
        elif "torch/autograd" in f.f_code.co_filename and collective is None:
            collective = "backward (gradient all-reduce)"
    inside = None  # no collective named: the torch function it waits in (one that calls C++ directly, as DDP's do)
    f = stack[0] if stack and detail else None
    if collective is None and f is not None and "/torch/" in f.f_code.co_filename:  # (not torch calling user code)
        path = f.f_code.co_filename
        inside = f"{getattr(f.f_code, 'co_qualname', f.f_code.co_name)} (torch/{path.rsplit('/torch/', 1)[1]})"
    line = None
    for f in stack:  # innermost first, up to nblaunch's own frames (what is outside them is not this request's)
        path = f.f_code.co_filename
        if is_nblaunch_file(path):
            break
        if "/torch/" in path or "/site-packages/" in path or "/lib/python" in path:
            continue
        line = cell_place(path, f.f_lineno) or f"{path}, line {f.f_lineno}, in {f.f_code.co_name}"
        break
    calling = calling_of(stack[0]) if detail and stack and collective is None and inside is None and line else None
    return {
        "line": line,
        "collective": collective,
        "inside": inside,
        "calling": calling,
        "seq": _seq(),
        "group": group_generation,
    }


class WaitWatch:
    """Sends one ``waiting`` event when the main thread stays in one collective for ``WAIT_REPORT_S``."""

    def __init__(self, events):
        self.events = events
        self.seen = None  # (frame id, seq) first seen waiting
        self.sent = False

    def check(self, busy: bool) -> None:
        """Called by the reader thread about every half second."""
        at = where_main(detail=False) if busy else None
        key = (at["collective"], at["seq"], at["line"]) if at and at["collective"] else None
        if key != self.seen:
            self.seen, self.sent = key, False
            return
        if key is not None and not self.sent:
            self.sent = True
            self.events.send("waiting", at)


def socket_inodes() -> frozenset[str]:
    """The inodes of the sockets this process holds now. A forked rank calls it first thing: what it holds
    then is the kernel's (Jupyter's ZMQ connections among them), never its own to shut down.

    Example::

        >>> inherited = socket_inodes()   # doctest: +SKIP
    """
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            found.add(target[8:-1])
    return frozenset(found)


def abort_group(inherited: frozenset[str] = frozenset()) -> None:
    """Make every collective this rank waits in return (the reader thread, while the main thread waits in C):
    its process-group connections shut down (gloo's pairs, NCCL's bootstrap; ``close_group_sockets``), then
    its NCCL communicators aborted (``abort_nccl``). Sockets first: an NCCL group still connecting waits on
    them, and its abort would wait for that."""
    close_group_sockets(inherited)
    abort_nccl()


def nccl_groups() -> list:
    """This rank's process groups with an NCCL backend, as (group, backend), in the order torch aborts them
    (``_abort_process_group``: by name, the newest first). Empty without NCCL or a process group."""
    try:
        import torch
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d
    except ImportError:
        return []
    if not (dist.is_available() and dist.is_initialized() and c10d.is_nccl_available()):
        return []
    found = []
    names = dict(c10d._world.pg_names)  # (read once: the main thread may be anywhere)
    for pg in sorted(names, key=lambda g: names[g], reverse=True):
        try:
            backend = pg._get_backend(torch.device("cuda"))
        except RuntimeError:  # no CUDA backend in this group (gloo only)
            continue
        if isinstance(backend, dist.ProcessGroupNCCL):
            found.append((pg, backend))
    return found


def abort_nccl() -> int:
    """Abort every NCCL communicator of this rank (``ProcessGroup.abort()``: ncclCommAbort; the collectives
    on the GPU return). torch's own bookkeeping of the groups is left to the main thread's rebuild. Between
    ncclGroupStart/End, as torch does, so that the communicators' aborts do not wait on each other. How many
    groups were aborted."""
    groups = nccl_groups()
    if not groups:
        return 0
    first = groups[0][1]
    first._group_start()
    try:
        for pg, _ in groups:
            pg.abort()
    finally:
        first._group_end()
    return len(groups)


def close_group_sockets(inherited: frozenset[str] = frozenset()) -> int:
    """Shut down every established TCP connection this rank opened, except the rendezvous store's: the
    process group's pair sockets. A collective blocked on them raises at once. Returns how many.

    ``inherited`` (``socket_inodes()`` at the rank's start) are left alone: a forked rank holds the
    kernel's own connections (Jupyter's shell/iopub/control), and ``shutdown`` on a shared socket cuts
    it for the kernel too — its reply to the running cell is lost and the cell never ends."""
    store_port = int(os.environ.get("MASTER_PORT", "0") or 0)
    conns = {}
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            with open(table) as fh:
                next(fh)
                for row in fh:
                    f = row.split()
                    if f[3] == "01" and f[9] not in inherited:  # ESTABLISHED, and this rank's own
                        conns[f[9]] = (int(f[1].rsplit(":", 1)[1], 16), int(f[2].rsplit(":", 1)[1], 16))
        except OSError:
            continue
    closed = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        ports = conns.get(target[8:-1]) if target.startswith("socket:[") else None
        if ports is None or store_port in ports:
            continue
        try:
            s = socket.socket(fileno=os.dup(int(fd)))
        except OSError:
            continue
        try:
            s.shutdown(socket.SHUT_RDWR)
            closed += 1
        except OSError:
            pass
        finally:
            s.close()
    return closed


def rebuild_group(gen: int, namespace: dict) -> list[str]:
    """A new default process group in this same process (store prefix ``gen``); DDP models re-pointed.
    Returns notes for the kernel: what still holds the old group and what to do about it."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    old = c10d._get_default_group()
    backend = dist.get_backend()
    store = c10d._get_default_store()
    rank, size = dist.get_rank(), dist.get_world_size()
    timeout = group_timeout(old) or group_owner.GROUP_TIMEOUT
    others = []  # (a loop, not a comprehension: that would hold ``old`` in a closure cell, a referrer of its own)
    for pg in list(c10d._world.pg_map):
        if pg is not old:
            others.append(pg)
    held = _holders(namespace, others)
    # nblaunch's own init/destroy of the default group are no-ops for user code (worker.group_owner): torch's here.
    # (The old group's sockets are shut down already, so its destructor has nothing to wait for.)
    init = getattr(dist.init_process_group, "__wrapped__", dist.init_process_group)
    destroy = getattr(dist.destroy_process_group, "__wrapped__", dist.destroy_process_group)
    nccl = bool(nccl_groups())
    if nccl:  # every group's communicators aborted (again, or first: a rank that ran ahead), then forgotten
        c10d._abort_process_group()
    else:
        destroy()
    init(backend=backend, store=rebuilt_store(gen, store), rank=rank, world_size=size, timeout=timeout)  # old timeout
    if nccl:  # the communicator made now, as at the rank's start (worker.lifecycle): not in the next cell
        import torch

        dist.barrier(device_ids=[torch.cuda.current_device()])
    global group_generation
    group_generation = gen
    notes = _repoint(old, c10d._get_default_group())
    if held:
        notes.append(
            f"{', '.join(held)} still hold(s) a process group made before the rebuild (new_group, DeviceMesh): "
            "make it again in a cell (dist.new_group(...), init_device_mesh(...))"
        )
    return notes


def rebuilt_store(gen: int, store):
    """The store of default group ``gen``: its own prefix on the rendezvous store itself, under no earlier group's
    prefix, so that a rank new to the world (a lost rank's replacement) finds it knowing only ``gen``."""
    import torch.distributed as dist

    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    return dist.PrefixStore(f"nblaunch-rebuild-{gen}", store)


def join_rebuilt_group(gen: int, backend: str, rank: int, world_size: int) -> None:
    """A lost rank's replacement (a new process) joins the default group ``gen`` its peers rebuild in place
    (``rebuild_group``), on the kernel's rendezvous store (``MASTER_ADDR``/``MASTER_PORT``)."""
    import torch.distributed as dist

    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None, False, group_owner.GROUP_TIMEOUT
    )
    dist.init_process_group(
        backend=backend,
        store=rebuilt_store(gen, store),
        rank=rank,
        world_size=world_size,
        timeout=group_owner.GROUP_TIMEOUT,
    )
    global group_generation
    group_generation = gen


def _repoint(old, new) -> list[str]:
    """Every object still holding ``old``: DDP models get ``new``; the others are named. One pass of the
    collector over the referrers (in C), not a Python loop over every object: this runs inside a failed cell."""
    import types

    from torch.nn.parallel import DistributedDataParallel

    owners = []
    for ref in gc.get_referrers(old):
        if isinstance(ref, types.FrameType):
            continue
        if type(ref) is dict:  # an instance's __dict__: its owner holds the group
            owners += [o for o in gc.get_referrers(ref) if getattr(o, "__dict__", None) is ref]
        else:
            owners.append(ref)
    stuck = set()
    for owner in owners:
        if isinstance(owner, DistributedDataParallel):
            owner._update_process_group(new)
        elif not isinstance(owner, (list, tuple, set, types.FrameType, types.CellType)):
            stuck.add(type(owner).__name__)
    if stuck:
        return [
            f"{', '.join(sorted(stuck))} object(s) still hold the old process group and will fail: make them again "
            "in a cell (FSDP: wrap the model again)"
        ]
    return []


def _holders(namespace: dict, groups) -> list[str]:
    """Namespace names whose value is, or holds, one of ``groups`` (a user's new_group, a DeviceMesh)."""
    if not groups:
        return []
    ids = {id(g) for g in groups}
    names = []
    for name, value in namespace.items():
        if id(value) in ids or type(value).__name__ == "DeviceMesh":
            names.append(name)
    return names or [f"{len(groups)} group(s) made with new_group"]


def group_timeout(group):
    """The collective timeout of ``group`` (a ``datetime.timedelta``), or None where torch does not say."""
    import torch

    for device in ("cpu", "cuda"):
        try:
            return group._get_backend(torch.device(device)).options._timeout
        except (RuntimeError, AttributeError):
            continue
    return None
