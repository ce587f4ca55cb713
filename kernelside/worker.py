"""What runs inside each worker process, forked or spawned.

In order: tie the worker's life to the kernel (parent-death signal), point fds 1/2 at
the kernel's pipes, apply the environment contract, initialize the default process
group, run the payload, send the result (tensors moved to CPU) or the error over the
event channel, and leave with ``os._exit`` so nothing inherited from the kernel (its
atexit hooks, its ZMQ sockets) runs in the worker.

The payload is a ``Payload``: a callable and its arguments, plus what the worker must
know (rank, backend, where to send events).

A spawned worker runs ``SPAWN_COMMAND`` with the kernel's own interpreter; it reads the
function and its arguments from the memfd named by ``NBLAUNCH_PAYLOAD_FD`` and the rest
from ``NBLAUNCH_*`` variables.
"""

from __future__ import annotations

import ctypes
import dataclasses
import io
import mmap
import os
import signal
import sys
import time
import traceback
import types

from . import metric_capture, progress, sharded_results
from .channel import EventWriter

PR_SET_PDEATHSIG = 1
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


@dataclasses.dataclass
class Payload:
    fn: object
    args: tuple
    kwargs: dict
    rank: int
    world_size: int
    backend: str
    device: str
    env: dict
    parent_pid: int
    events_fd: int
    return_result: bool
    pg_timeout_s: float | None = None
    close_fds: tuple = ()  # (fork only) launch fds that belong to other ranks or to the kernel


@dataclasses.dataclass
class WorkerContext:
    """What user code can ask about the worker it runs in (``kernelside.worker_context()``)."""

    rank: int
    local_rank: int
    world_size: int
    device: str
    events: EventWriter


CURRENT: WorkerContext | None = None

# -c rather than -m: under -m this file would run as __main__, a second copy of the module.
SPAWN_COMMAND = "from kernelside.worker import _spawned_main; _spawned_main()"


def _libc():
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def _die_with_parent(parent_pid: int) -> None:
    libc = _libc()
    if libc is not None and sys.platform.startswith("linux"):
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the kernel died before prctl took effect
        os._exit(1)


def _fresh_std_streams() -> None:
    """New sys.stdout/sys.stderr on fds 1/2, line-buffered, and old stream objects redirected.

    Libraries keep references to the kernel's stream objects (a logging handler made in an
    earlier cell, say); pointing their write/flush at the new streams keeps that output on
    this worker's pipes instead of the kernel's ZMQ sockets.
    """
    kernel_streams = (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)
    out = io.TextIOWrapper(
        io.FileIO(1, "w", closefd=False),
        encoding="utf-8",
        errors="backslashreplace",
        line_buffering=True,
        write_through=False,
    )
    err = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace", line_buffering=True
    )
    for stream, new in zip(kernel_streams, (out, err, out, err), strict=True):
        if stream is None:
            continue
        try:
            stream.write = new.write
            stream.flush = new.flush
        except (AttributeError, TypeError):
            pass  # builtin TextIOWrapper objects cannot be patched; they already write to fds 1/2
    sys.stdout, sys.stderr = out, err
    sys.__stdout__, sys.__stderr__ = out, err
    sys.stdin = open(os.devnull)
    _enable_faulthandler()


def _enable_faulthandler() -> None:
    # A crash (SIGSEGV, SIGBUS, ...) then leaves its Python stack in this rank's own output,
    # where the error summary shows it, instead of on whatever fd the kernel had chosen.
    import faulthandler

    faulthandler.enable(file=sys.stderr, all_threads=True)


def _forget_kernel_shell() -> None:
    """The inherited IPython shell talks to the kernel's ZMQ sockets, which belong to the kernel
    process: without it, get_ipython() is None here and display()/tqdm.auto fall back safely."""
    mod = sys.modules.get("IPython.core.interactiveshell")
    if mod is not None:
        mod.InteractiveShell.clear_instance()


def _flush_all() -> None:
    for s in (sys.stdout, sys.stderr):
        try:
            s.flush()
        except Exception:
            pass
    libc = _libc()
    if libc is not None:
        libc.fflush(None)  # C-level stdio buffers (printf from extensions)


def _set_threads() -> None:
    n = os.environ.get("OMP_NUM_THREADS")
    if n and n.isdigit():
        import torch

        torch.set_num_threads(int(n))


def _patch_init_process_group(namespaces) -> None:
    """Existing DDP code calls init_process_group() itself: make that a no-op once ours is up."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    original = c10d.init_process_group
    if getattr(original, "_nblaunch", False):
        return

    def init_process_group(*args, **kwargs):
        if dist.is_initialized():
            return None
        return original(*args, **kwargs)

    init_process_group._nblaunch = True
    init_process_group.__doc__ = original.__doc__
    init_process_group.__wrapped__ = original
    dist.init_process_group = c10d.init_process_group = init_process_group
    for ns in namespaces:
        for k, v in list(ns.items()):
            if v is original:
                ns[k] = init_process_group


def _init_process_group(p: Payload) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    if p.device.startswith("cuda"):
        torch.cuda.set_device(torch.device(p.device))
    kwargs = {}
    if p.pg_timeout_s:
        kwargs["timeout"] = datetime.timedelta(seconds=p.pg_timeout_s)
    dist.init_process_group(backend=p.backend, init_method="env://", rank=p.rank, world_size=p.world_size, **kwargs)
    # gloo can return from init on one rank while a peer is still completing its connections;
    # a rank whose code then ends at once would close them under the peer. Meet once first.
    if p.backend == "nccl":
        dist.barrier(device_ids=[torch.cuda.current_device()])  # names the device: no NCCL guesswork
    else:
        dist.barrier()


def _to_cpu_pickler():
    """A cloudpickle pickler that moves every non-CPU tensor to CPU as it is written, wherever it sits."""
    import cloudpickle
    import torch

    shards = sharded_results.shard_types()

    class ToCPUPickler(cloudpickle.Pickler):
        def reducer_override(self, obj):
            if shards and isinstance(obj, shards):  # never send a shard that looks like the whole
                raise sharded_results.ShardedResultError(
                    f"{sharded_results.describe_shard(obj)} is still in the return value: it sits inside an object "
                    "nblaunch does not look into (one that pickles itself). Return it in a dict, list, tuple or module."
                )
            if isinstance(obj, (type, types.FunctionType)) and _KERNEL_MAIN_OBJECTS.get(
                getattr(obj, "__qualname__", None)
            ) == id(obj):
                return (_kernel_main_attr, (obj.__qualname__,))
            if isinstance(obj, torch.Tensor) and obj.device.type != "cpu":
                cpu = obj.detach().to("cpu")
                if isinstance(obj, torch.nn.Parameter):  # modules need Parameters back, not tensors
                    return (torch.nn.Parameter, (cpu.as_subclass(torch.Tensor), obj.requires_grad))
                if cpu.device.type != "cpu":  # a subclass that keeps claiming a device: keep the data
                    cpu = cpu.as_subclass(torch.Tensor)
                return (_identity, (cpu,))
            return super().reducer_override(obj)

    return ToCPUPickler


def _identity(x):
    return x


# Under fork, classes and functions the notebook defined before the launch exist in the
# kernel too: results refer to them by name, so a returned ``Net`` instance is an instance
# of the notebook's own ``Net`` class, not of a copy.
_KERNEL_MAIN_OBJECTS: dict[str, int] = {}


def _remember_kernel_main_objects() -> None:
    main = sys.modules.get("__main__")
    for name, obj in list(vars(main).items()) if main is not None else ():
        if isinstance(obj, (type, types.FunctionType)) and getattr(obj, "__module__", None) == "__main__":
            if getattr(obj, "__qualname__", None) == name:
                _KERNEL_MAIN_OBJECTS[name] = id(obj)


def _kernel_main_attr(qualname: str):
    return getattr(sys.modules["__main__"], qualname)


def dumps_result(value) -> bytes:
    """Pickle a return value with every tensor on CPU, so the kernel never initializes CUDA receiving it."""
    buf = io.BytesIO()
    _to_cpu_pickler()(buf, protocol=5).dump(value)
    return buf.getvalue()


def unwrap_for_return(value):
    """A DDP-wrapped module comes back as the plain module."""
    mod = getattr(value, "module", None)
    if mod is not None and type(value).__name__ in ("DistributedDataParallel", "DataParallel"):
        return mod
    return value


def _user_traceback(exc: BaseException) -> str:
    """The formatted traceback without nblaunch's own frames at the top."""
    tb = exc.__traceback__
    while tb is not None and os.path.dirname(tb.tb_frame.f_code.co_filename) == _PACKAGE_DIR:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb or exc.__traceback__))


def _error_payload(exc: BaseException, phase: str) -> dict:
    return {
        "type": type(exc).__name__,
        "module": type(exc).__module__,
        "message": str(exc),
        "traceback": _user_traceback(exc),
        "phase": phase,
        "t": time.monotonic(),
    }


def run(p: Payload) -> None:
    """Run one rank to completion and leave the process. Never returns."""
    global CURRENT
    code = 1
    events = EventWriter(p.events_fd)
    phase = "startup"
    try:
        os.environ.update(p.env)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        _set_threads()
        CURRENT = WorkerContext(p.rank, int(p.env.get("LOCAL_RANK", p.rank)), p.world_size, p.device, events)
        phase = "init_process_group"
        _init_process_group(p)
        namespaces = [getattr(p.fn, "__globals__", {})]
        main = sys.modules.get("__main__")
        if main is not None:
            namespaces.append(vars(main))
        _patch_init_process_group(namespaces)
        progress.install_in_worker()
        metric_capture.install_in_worker()
        events.send("ready", {"t": time.monotonic(), "pid": os.getpid()})
        phase = "run"
        value = p.fn(*p.args, **p.kwargs)
        progress.finish_in_worker()
        events.send("done", {"t": time.monotonic()})
        phase = "result gather"  # every rank: sharded values (FSDP, DTensor) are gathered together
        value = sharded_results.gather_for_return(unwrap_for_return(value), keep=p.return_result)
        phase = "result"
        if p.return_result:
            events.send_result(dumps_result(value))
        code = 0
    except SystemExit as e:  # sys.exit(0) in user code is a normal end, like a script's
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if phase == "run":
            sharded_results.leave()  # no peer waits for this rank's part of a gather
        if code != 0:
            events.send("error", _error_payload(e, phase))
    except BaseException as e:  # noqa: B036 - every failure must reach the kernel
        try:
            if phase == "result":
                e = RuntimeError(
                    f"rank {p.rank}'s return value could not be sent back: {type(e).__name__}: {e}. "
                    "Return plain data (numbers, lists, dicts, tensors, state_dict()) instead."
                )
            events.send("error", _error_payload(e, phase))
        except Exception:
            traceback.print_exc()
    finally:
        try:
            import torch.distributed as dist

            if code == 0 and dist.is_initialized():
                dist.destroy_process_group()
        except Exception:
            pass
        _flush_all()
        os._exit(code)


def enter_forked(p: Payload, out_fd: int, err_fd: int) -> None:
    """First thing a forked child does. Never returns."""
    try:
        os.setsid()  # own process group: the kernel's SIGINT does not reach us, and killpg reaches our children
        _die_with_parent(p.parent_pid)
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        for fd in p.close_fds:
            try:
                os.close(fd)
            except OSError:
                pass
        _fresh_std_streams()
        _forget_kernel_shell()
        _remember_kernel_main_objects()
    except BaseException:
        os._exit(70)
    run(p)


def payload_env(p: Payload) -> dict:
    """The rank-specific part of a payload, as environment variables for a spawned worker."""
    return {
        "NBLAUNCH_RANK": str(p.rank),
        "NBLAUNCH_WORLD_SIZE": str(p.world_size),
        "NBLAUNCH_BACKEND": p.backend,
        "NBLAUNCH_DEVICE": p.device,
        "NBLAUNCH_PARENT_PID": str(p.parent_pid),
        "NBLAUNCH_RETURN_RESULT": "1" if p.return_result else "0",
        "NBLAUNCH_PG_TIMEOUT": str(p.pg_timeout_s or ""),
        "NBLAUNCH_EVENTS_FD": str(p.events_fd),
    }


def _spawned_main() -> None:
    """Entry of ``python -m kernelside.worker``: the shared function blob comes from a memfd."""
    import json

    import cloudpickle

    env = os.environ
    parent = int(env["NBLAUNCH_PARENT_PID"])
    _die_with_parent(parent)
    events_fd = int(env["NBLAUNCH_EVENTS_FD"])
    for entry in reversed(json.loads(env.get("NBLAUNCH_SYS_PATH", "[]"))):
        if entry not in sys.path:
            sys.path.insert(1, entry)
    fd = int(env["NBLAUNCH_PAYLOAD_FD"])
    try:
        with mmap.mmap(fd, os.fstat(fd).st_size, prot=mmap.PROT_READ) as m:
            fn, args, kwargs = cloudpickle.loads(m)
    except BaseException as e:
        EventWriter(events_fd).send("error", _error_payload(e, "unpickle"))
        _flush_all()
        os._exit(1)
    os.close(fd)
    _enable_faulthandler()
    p = Payload(
        fn=fn,
        args=args,
        kwargs=kwargs,
        rank=int(env["NBLAUNCH_RANK"]),
        world_size=int(env["NBLAUNCH_WORLD_SIZE"]),
        backend=env["NBLAUNCH_BACKEND"],
        device=env["NBLAUNCH_DEVICE"],
        env={},
        parent_pid=parent,
        events_fd=events_fd,
        return_result=env["NBLAUNCH_RETURN_RESULT"] == "1",
        pg_timeout_s=float(env["NBLAUNCH_PG_TIMEOUT"]) if env.get("NBLAUNCH_PG_TIMEOUT") else None,
    )
    run(p)
