"""How a rank of the local engine starts and leaves: forked from the kernel, or spawned.

Forked: tie the worker's life to the kernel (parent-death signal), own process group, fds 1/2
to the kernel's pipes, fresh std streams, forget the kernel's IPython shell. Spawned: the
kernel's own interpreter runs ``SPAWN_COMMAND``, which reads the function and its arguments
from the memfd named by ``NBLAUNCH_PAYLOAD_FD`` and the rank's ``RankSpec`` from
``NBLAUNCH_RANK_SPEC``. Both then run the one life cycle (``lifecycle.run_rank``) and leave with
``os._exit``, so nothing inherited from the kernel (its atexit hooks, its ZMQ sockets) runs here.

Example::

    >>> start = RankStart(work=(train, (), {}), spec=spec, parent_pid=os.getpid())   # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import json
import mmap
import os
import signal
import sys

from .. import process_tree
from ..channel import EventWriter
from ..debugger.undebugged import drop_inherited_tracer
from .lifecycle import RankSpec, error_payload, run_rank
from .results import remember_kernel_main_objects
from .std_streams import enable_faulthandler, flush_all, forget_kernel_shell, fresh_std_streams, libc

PR_SET_PDEATHSIG = 1
SPEC_ENV = "NBLAUNCH_RANK_SPEC"
PAYLOAD_FD_ENV = "NBLAUNCH_PAYLOAD_FD"
EVENTS_FD_ENV = "NBLAUNCH_EVENTS_FD"
PARENT_ENV = "NBLAUNCH_PARENT_PID"
SYS_PATH_ENV = "NBLAUNCH_SYS_PATH"
REQUESTS_FD_ENV = "NBLAUNCH_REQUESTS_FD"
REPLIES_FD_ENV = "NBLAUNCH_REPLIES_FD"

# -c rather than -m: under -m this file would run as __main__, a second copy of the module.
SPAWN_COMMAND = "from kernelside.worker.entry import spawned_main; spawned_main()"


@dataclasses.dataclass
class RankStart:
    """How one local rank starts: what it runs, its spec, and the launch's file descriptors."""

    work: tuple  # (fn, args, kwargs); under spawn it travels separately, by memfd
    spec: RankSpec
    parent_pid: int
    events_fd: int = -1
    close_fds: tuple = ()  # (fork only) launch fds that belong to other ranks or to the kernel
    requests_fd: int = -1  # a live rank's kernel → rank request pipe (work is then its namespace, or None)
    replies_fd: int = -1  # kernel → rank: answers to rank 0's input() / pdb prompts (worker/rank_stdin.py)


def _die_with_parent(parent_pid: int) -> None:
    c = libc()
    if c is not None and sys.platform.startswith("linux"):
        c.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the kernel died before prctl took effect
        os._exit(1)


def _run_and_exit(p: RankStart) -> None:
    process_tree.adopt_orphans()  # what the rank starts stays below it, daemons included: ended with it
    if p.requests_fd >= 0:
        from .live_rank import serve_requests

        namespace = p.work if isinstance(p.work, dict) else {}
        end = serve_requests(p.spec, EventWriter(p.events_fd), p.requests_fd, namespace, p.replies_fd)
    else:
        end = run_rank(p.spec, p.work, EventWriter(p.events_fd), p.replies_fd)
    # Results are sent; flushed output is all that is left. No destructor runs (os._exit): gloo's
    # process-group destructor can deadlock on the GIL, and the group is nblaunch's (group_owner.py).
    _end_wandb_service()
    flush_all()
    process_tree.end_descendants()  # nothing the rank started outlives it (NBLAUNCH_KEEP=1 excepted)
    os._exit(end.code)


def _end_wandb_service() -> None:
    # wandb's service (wandb-core, this rank's child) is ended by an atexit hook that os._exit skips: without
    # this it outlives the rank until it notices its parent is gone. A no-op where wandb never started it.
    wandb = sys.modules.get("wandb")
    if wandb is None or not hasattr(wandb, "teardown"):
        return
    try:
        wandb.teardown()
    except Exception as e:  # the rank's results are already sent: say so, leave with its own exit code
        print(f"nblaunch: wandb.teardown() at the end of the rank failed: {e!r}", file=sys.stderr)


def enter_forked(p: RankStart, out_fd: int, err_fd: int) -> None:
    """First thing a forked child does. Never returns."""
    try:
        drop_inherited_tracer()  # (the kernel's debugger, if on, was left behind at the fork)
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
        fresh_std_streams()
        forget_kernel_shell()
        remember_kernel_main_objects()
    except BaseException:
        os._exit(70)
    _run_and_exit(p)


def spawn_env(p: RankStart, memfd: int) -> dict:
    """What a spawned rank reads at start, as environment variables (the transport, not the rank's env)."""
    return {
        SPEC_ENV: json.dumps(dataclasses.asdict(p.spec)),
        PARENT_ENV: str(p.parent_pid),
        EVENTS_FD_ENV: str(p.events_fd),
        PAYLOAD_FD_ENV: str(memfd),
        SYS_PATH_ENV: json.dumps([e for e in sys.path if e]),
        REQUESTS_FD_ENV: str(p.requests_fd),
        REPLIES_FD_ENV: str(p.replies_fd),
    }


def spawned_main() -> None:
    """Entry of a spawned rank: the shared function blob comes from a memfd, the spec from the environment."""
    import cloudpickle

    env = os.environ
    parent = int(env[PARENT_ENV])
    _die_with_parent(parent)
    events_fd = int(env[EVENTS_FD_ENV])
    for entry in reversed(json.loads(env.get(SYS_PATH_ENV, "[]"))):
        if entry not in sys.path:
            sys.path.insert(1, entry)
    fd = int(env[PAYLOAD_FD_ENV])
    try:
        with mmap.mmap(fd, os.fstat(fd).st_size, prot=mmap.PROT_READ) as m:
            work = cloudpickle.loads(m)
    except BaseException as e:
        EventWriter(events_fd).send("error", error_payload(e, "unpickle"))
        flush_all()
        os._exit(1)
    os.close(fd)
    enable_faulthandler()
    spec = RankSpec(**json.loads(env[SPEC_ENV]))
    spec.env = {}  # already in this process's environment
    requests_fd = int(env.get(REQUESTS_FD_ENV, "-1"))
    replies_fd = int(env.get(REPLIES_FD_ENV, "-1"))
    _run_and_exit(
        RankStart(
            work=work,
            spec=spec,
            parent_pid=parent,
            events_fd=events_fd,
            requests_fd=requests_fd,
            replies_fd=replies_fd,
        )
    )
