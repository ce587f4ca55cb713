"""A group of worker processes: start them, learn when each ends, and stop them all.

Each worker is the leader of its own process group, so ``close()`` reaches whatever it
started (DataLoader workers, subprocesses) with one ``killpg``. Exit statuses are read
with ``WNOWAIT`` while the group runs: a worker stays a zombie until ``close()``, so its
pid (and with it its process-group id) cannot be reused by another process while we may
still signal it. ``close()`` is the only place that reaps.

Example::

    >>> g = WorkerGroup.start(payloads, "fork")      # doctest: +SKIP
    >>> g.poll(g.workers[0])                         # None while running, else its ExitStatus
    >>> g.close()
"""

from __future__ import annotations

import dataclasses
import os
import select
import signal
import subprocess
import sys
import time

from .. import interrupts, process_tree
from ..debugger.undebugged import ranks_start_undebugged
from ..worker.entry import SPAWN_COMMAND, RankStart, enter_forked, spawn_env
from .contract import ExitStatus


@dataclasses.dataclass
class RankPipes:
    """One rank's pipes: stdout, stderr and events (worker → kernel), replies (kernel → worker: the
    answers to rank 0's input prompts) and, for a live rank, requests (kernel → worker: the next cell).
    ``write_ends()`` are the ends the worker keeps, ``read_ends()`` the ends the kernel keeps (for
    replies and requests, the writing ends)."""

    stdout_r: int
    stdout_w: int
    stderr_r: int
    stderr_w: int
    events_r: int
    events_w: int
    replies_r: int
    replies_w: int
    requests_r: int = -1
    requests_w: int = -1

    @classmethod
    def create(cls, live: bool = False) -> RankPipes:
        from ..channel import widen_pipe

        o_r, o_w = os.pipe()
        e_r, e_w = os.pipe()
        v_r, v_w = os.pipe()
        a_r, a_w = os.pipe()
        widen_pipe(v_r)
        q_r, q_w = os.pipe() if live else (-1, -1)
        if live:
            widen_pipe(q_w)
        return cls(o_r, o_w, e_r, e_w, v_r, v_w, a_r, a_w, q_r, q_w)

    def write_ends(self) -> tuple[int, ...]:
        """The worker's ends (closed in the kernel once the worker has them)."""
        live = (self.requests_r,) if self.requests_r >= 0 else ()
        return (self.stdout_w, self.stderr_w, self.events_w, self.replies_r) + live

    def read_ends(self) -> tuple[int, ...]:
        """The kernel's ends (closed when the worker is reaped)."""
        live = (self.requests_w,) if self.requests_w >= 0 else ()
        return (self.stdout_r, self.stderr_r, self.events_r, self.replies_w) + live


@dataclasses.dataclass
class Worker:
    rank: int
    pid: int
    pipes: RankPipes
    pidfd: int | None
    popen: subprocess.Popen | None = None
    status: ExitStatus | None = None
    reaped: bool = False
    template: object | None = None  # forkserver: the template whose child this is (engines/forkserver.py)
    node = None  # where it runs, for worlds past one machine (live.ray_channel.RayRank); here: this machine
    here = True  # on the kernel's machine: its pid is one of this /proc


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None  # old kernel: exits are found by polling instead


def close_quietly(*fds: int) -> None:
    """Close each fd; one already closed (or never opened) is not an error."""
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


class WorkerGroup:
    """N worker processes, each in its own process group."""

    def __init__(self):
        self.workers: list[Worker] = []
        self.closed = False
        self.strays: set[tuple[int, int]] = set()  # what the ranks started, noted before each signal (process_tree)

    # -- start ------------------------------------------------------------------------
    @classmethod
    def start(
        cls,
        payloads: list[RankStart],
        method: str,
        *,
        spawn_blob: bytes | None = None,
        keep_fds: tuple[int, ...] = (),
        live: bool = False,
        template=None,
    ) -> WorkerGroup:
        """Start one worker per payload (``live``: each with a request pipe); ``method`` "forkserver" forks
        them from ``template``. On any failure, everything started is stopped again."""
        group = cls()
        pipes = [RankPipes.create(live) for _ in payloads]
        memfd = None
        try:
            if method in ("spawn", "forkserver"):
                memfd = os.memfd_create("nblaunch-payload", os.MFD_CLOEXEC)
                write_all(memfd, spawn_blob)
            all_launch_fds = [fd for p in pipes for fd in (*p.read_ends(), *p.write_ends())] + list(keep_fds)
            for payload, rp in zip(payloads, pipes, strict=True):
                payload.events_fd = rp.events_w
                payload.requests_fd = rp.requests_r
                payload.replies_fd = rp.replies_r
                if method == "fork":
                    own = set(rp.write_ends())
                    payload.close_fds = tuple(fd for fd in all_launch_fds if fd not in own)
                    pid, popen = _fork(payload, rp), None
                elif method == "forkserver":
                    out_w, err_w, events_w, replies_r, *requests_r = rp.write_ends()
                    fds = (out_w, err_w, events_w, replies_r, memfd, *requests_r)
                    pid, popen = template.fork(launch_time_request(payload), fds), None
                else:
                    popen = _spawn(payload, rp, memfd)
                    pid = popen.pid
                owner = template if method == "forkserver" else None
                group.workers.append(Worker(payload.spec.rank, pid, rp, _pidfd(pid), popen, template=owner))
                close_quietly(*rp.write_ends())
        except BaseException:
            for rp in pipes[len(group.workers) :]:
                close_quietly(*rp.write_ends())
            group.close(grace=0)
            for rp in pipes[len(group.workers) :]:
                close_quietly(*rp.read_ends())
            raise
        finally:
            if memfd is not None:
                os.close(memfd)
        return group

    # -- observe ----------------------------------------------------------------------
    def poll(self, w: Worker) -> ExitStatus | None:
        """The worker's exit status if it has ended, without reaping it."""
        if w.status is None and w.template is not None:
            w.status = w.template.exit_status(w.pid, w.pidfd)
        elif w.status is None:
            try:
                info = os.waitid(os.P_PID, w.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                info = None
            if info is not None and info.si_pid == w.pid:
                if info.si_code == os.CLD_EXITED:
                    w.status = ExitStatus(info.si_status, None)
                else:
                    w.status = ExitStatus(None, info.si_status)
        return w.status

    def running(self) -> list[Worker]:
        return [w for w in self.workers if self.poll(w) is None]

    # -- stop -------------------------------------------------------------------------
    def signal_all(self, sig: int) -> None:
        # what the ranks started, noted before they are signalled: a SIGKILLed rank cannot end its own tree
        self.strays.update(process_tree.descendants([w.pid for w in self.workers if not w.reaped]))
        for w in self.workers:
            if not w.reaped:
                try:
                    os.killpg(w.pid, sig)
                except ProcessLookupError:
                    # a rank forked a moment ago has not called setsid() yet (no process group of its pid): the
                    # process itself, which is ours and unreaped, so its pid cannot be another's
                    try:
                        os.kill(w.pid, sig)
                    except (ProcessLookupError, PermissionError):
                        pass
                except PermissionError:
                    pass

    def wait_all(self, deadline: float) -> bool:
        """Wait until every worker has ended or ``deadline`` (monotonic) passes, or ■ is pressed again."""
        gate = interrupts.GATE
        presses = gate.presses
        pressed = interrupts.wake_fd()
        while True:
            alive = self.running()
            if not alive:
                return True
            left = deadline - time.monotonic()
            if left <= 0 or gate.presses_since(presses):
                return False
            fds = [w.pidfd for w in alive if w.pidfd is not None]
            if len(fds) == len(alive):
                select.select(fds + ([pressed] if pressed is not None else []), [], [], left)
                gate.drain()
            else:
                time.sleep(min(left, 0.02))

    def close(self, grace: float = 3.0) -> None:
        """SIGTERM to every worker's process group, SIGKILL after ``grace`` seconds, reap, close fds.

        Safe to call more than once and from ``finally`` blocks; a second Ctrl-C during the
        grace period skips straight to SIGKILL.
        """
        if self.closed:
            return
        try:
            if self.running():
                self.signal_all(signal.SIGTERM)
                if grace > 0:
                    try:
                        self.wait_all(time.monotonic() + grace)  # (■ pressed again: no more waiting)
                    except KeyboardInterrupt:  # (outside nblaunch's deferral: the same)
                        pass
        finally:
            # Always: stray grandchildren (DataLoader workers, a rank's own children) go too.
            self.signal_all(signal.SIGKILL)
            for w in self.workers:
                self._reap(w)
            process_tree.stop(self.strays)  # by pid and start time: a reused pid is never signalled
            self.closed = True

    def _reap(self, w: Worker) -> None:
        if w.reaped:
            return
        if w.template is not None:
            self._release_from_template(w)
        else:
            self._wait_child(w)
        if w.popen is not None:
            w.popen.returncode = w.status.exitcode if w.status and w.status.exitcode is not None else -1
        w.reaped = True
        close_quietly(*w.pipes.read_ends())
        if w.pidfd is not None:
            close_quietly(w.pidfd)

    def _wait_child(self, w: Worker) -> None:
        while True:
            try:
                _, raw = os.waitpid(w.pid, 0)
                if w.status is None:
                    w.status = (
                        ExitStatus(os.WEXITSTATUS(raw), None)
                        if os.WIFEXITED(raw)
                        else ExitStatus(None, os.WTERMSIG(raw))
                    )
                return
            except ChildProcessError:
                return
            except InterruptedError:
                continue

    def _release_from_template(self, w: Worker) -> None:
        """A forkserver rank is the template's child, not ours: the template reads its status and reaps it."""
        if w.pidfd is not None and w.status is None:
            select.select([w.pidfd], [], [], 5.0)  # SIGKILLed by close(): it ends at once
        self.poll(w)
        w.template.release(w.pid)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _fork(payload: RankStart, rp: RankPipes) -> int:
    with ranks_start_undebugged():
        pid = os.fork()
    if pid == 0:  # child
        enter_forked(payload, rp.stdout_w, rp.stderr_w)  # never returns
        os._exit(70)
    return pid


def launch_time_request(payload: RankStart) -> dict:
    """What a rank forked by the forkserver template takes from the kernel as it is now (not as it was
    when the template started): working directory, environment (with the rank's contract) and sys.path."""
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = list(sys.path) + ([here] if here not in sys.path else [])
    return {"spec": payload.spec, "env": {**os.environ, **payload.spec.env}, "sys_path": path, "cwd": os.getcwd()}


def _spawn(payload: RankStart, rp: RankPipes, memfd: int) -> subprocess.Popen:
    env = dict(os.environ)
    env.update(payload.spec.env)
    env.update(spawn_env(payload, memfd))
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), here) if p)
    with ranks_start_undebugged():
        return _popen_rank(env, rp, memfd)


def _popen_rank(env: dict, rp: RankPipes, memfd: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", SPAWN_COMMAND],
        stdin=subprocess.DEVNULL,
        stdout=rp.stdout_w,
        stderr=rp.stderr_w,
        pass_fds=(rp.events_w, rp.replies_r, memfd) + ((rp.requests_r,) if rp.requests_r >= 0 else ()),
        env=env,
        start_new_session=True,
        close_fds=True,
    )
