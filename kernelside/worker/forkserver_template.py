"""The forkserver's template process: a fresh interpreter holding torch, from which ranks are forked.

The kernel starts it (``engines.forkserver``) as ``python -c TEMPLATE_COMMAND``, never by forking
itself, so nothing of the kernel (a CUDA context, its threads, a lock some thread held) is in it.
It imports what every rank needs, says ``ready``, then serves the kernel over one ``SOCK_SEQPACKET``
socket: ``fork`` (with the rank's pipe ends and the pickled work as fds) answers ``forked`` and the
rank's pid; when a rank ends, ``exit`` carries its status (the rank is this process's child, not
the kernel's, so only this process can read it); ``release`` reaps it. Until then a finished rank
stays a zombie, so its pid, which the kernel signals as a process group, is never reused early.

The template lives as long as the kernel: it watches the kernel through a pidfd and, when the
kernel is gone (or closes the socket), kills every rank's process group and exits. Each rank also
has a parent-death signal on the template.

Example::

    >>> # in the kernel: engines.forkserver.Template.start()  starts this   # doctest: +SKIP
"""

from __future__ import annotations

import os
import pickle
import selectors
import signal
import socket
import sys
import traceback

TEMPLATE_COMMAND = "from kernelside.worker.forkserver_template import main; main()"
TEMPLATE_MARK = "nblaunch-forkserver"  # argv[1]: the template is recognisable in ps / psutil
MAX_MESSAGE = 1 << 22  # a fork request carries the kernel's environment and sys.path
MAX_FDS = 8


def send(sock: socket.socket, message: tuple, fds: tuple[int, ...] = ()) -> None:
    """One message (a pickled tuple) on the SOCK_SEQPACKET socket, with ``fds`` passed alongside."""
    socket.send_fds(sock, [pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)], list(fds))


def receive(sock: socket.socket) -> tuple[tuple | None, list[int]]:
    """One message and the fds that came with it; (None, []) when the other side has closed."""
    data, fds, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE, MAX_FDS)
    if not data:
        for fd in fds:
            os.close(fd)
        return None, []
    return pickle.loads(data), fds


def _warm_imports() -> None:
    import cloudpickle  # noqa: F401

    from . import before_fork, entry, lifecycle, live_rank  # noqa: F401  (every rank runs these)
    from .warm_imports import import_rank_modules

    import_rank_modules()  # what the kernel's warm-up imports for forked ranks
    before_fork.look()  # and the walks of every loaded module each rank would make


class _Template:
    def __init__(self, sock: socket.socket, kernel_pid: int):
        self.sock, self.kernel_pid = sock, kernel_pid
        self.sel = selectors.DefaultSelector()
        self.children: dict[int, int | None] = {}  # pid -> its pidfd while it runs, None once it ended

    def serve(self) -> None:
        kernel_fd = os.pidfd_open(self.kernel_pid)
        self.kernel_fd = kernel_fd
        self.sel.register(kernel_fd, selectors.EVENT_READ, ("kernel", None))
        self.sel.register(self.sock, selectors.EVENT_READ, ("socket", None))
        try:
            while True:
                for key, _ in self.sel.select():
                    what, pid = key.data
                    if what == "kernel":
                        return  # the kernel is gone: so are its ranks (finally)
                    if what == "child":
                        self._ended(pid)
                    elif not self._request():
                        return
        finally:
            self._end_all()

    def _request(self) -> bool:
        try:
            message, fds = receive(self.sock)
        except (ConnectionError, OSError):
            return False
        if message is None:
            return False
        if message[0] == "fork":
            self._fork(message[1], fds)
        elif message[0] == "release":
            self._release(message[1])
        return True

    def _fork(self, request: dict, fds: list[int]) -> None:
        try:
            pid = os.fork()
        except OSError as e:
            for fd in fds:
                os.close(fd)
            send(self.sock, ("failed", f"fork() in the forkserver template failed: {e}"))
            return
        if pid == 0:
            _enter_rank(request, fds, os.getppid())  # never returns
        for fd in fds:
            os.close(fd)
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            pidfd = None
        self.children[pid] = pidfd
        if pidfd is not None:
            self.sel.register(pidfd, selectors.EVENT_READ, ("child", pid))
        send(self.sock, ("forked", pid))

    def _ended(self, pid: int) -> None:
        pidfd = self.children.get(pid)
        if pidfd is None:
            return
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        if info is None:
            return
        self.sel.unregister(pidfd)
        os.close(pidfd)
        self.children[pid] = None
        if info.si_code == os.CLD_EXITED:
            status = (info.si_status, None)
        else:
            status = (None, info.si_status)
        send(self.sock, ("exit", pid, *status))

    def _release(self, pid: int) -> None:
        if pid not in self.children:
            return
        pidfd = self.children.pop(pid)
        if pidfd is not None:  # released before it ended (the kernel gave up on it): end it now
            self.sel.unregister(pidfd)
            os.close(pidfd)
            _kill_group(pid)
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass

    def _end_all(self) -> None:
        for pid in self.children:
            _kill_group(pid)
        for pid in self.children:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _enter_rank(request: dict, fds: list[int], template_pid: int) -> None:
    """In the forked rank: the kernel's launch-time cwd, environment and sys.path, its pipes on fds 0-2,
    then the same start as a spawned rank (the work unpickled from the memfd). Never returns."""
    from ..channel import EventWriter
    from .entry import RankStart, _die_with_parent, _run_and_exit
    from .lifecycle import error_payload
    from .std_streams import flush_all, fresh_std_streams

    try:
        os.setsid()  # own process group: the kernel signals the rank (and its children) with killpg
        _die_with_parent(template_pid)
        out_fd, err_fd, events_fd, replies_fd, memfd, *rest = fds
        requests_fd = rest[0] if rest else -1
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        keep = {0, 1, 2, events_fd, replies_fd, memfd, requests_fd}
        for name in os.listdir("/proc/self/fd"):  # the template's socket, pidfds, other ranks' ends
            if int(name) not in keep:
                try:
                    os.close(int(name))
                except OSError:
                    pass
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.environ.clear()
        os.environ.update(request["env"])
        sys.path[:] = request["sys_path"]
        fresh_std_streams()
    except BaseException:
        os._exit(70)
    events = EventWriter(events_fd)
    try:
        os.chdir(request["cwd"])
        import mmap

        import cloudpickle

        with mmap.mmap(memfd, os.fstat(memfd).st_size, prot=mmap.PROT_READ) as m:
            work = cloudpickle.loads(m)
        os.close(memfd)
    except BaseException as e:
        events.send("error", error_payload(e, "unpickle"))
        flush_all()
        os._exit(1)
    payload = RankStart(
        work=work,
        spec=request["spec"],
        parent_pid=template_pid,
        events_fd=events_fd,
        requests_fd=requests_fd,
        replies_fd=replies_fd,
    )
    _run_and_exit(payload)


def main() -> None:
    """The template's entry: ``python -c TEMPLATE_COMMAND nblaunch-forkserver SOCKET_FD KERNEL_PID``."""
    sock = socket.socket(fileno=int(sys.argv[2]))
    kernel_pid = int(sys.argv[3])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # an interrupt is for the kernel's cell, not for us
    if os.getppid() != kernel_pid:
        os._exit(1)  # the kernel died before we started
    try:
        _warm_imports()
    except BaseException as e:
        send(sock, ("failed", "".join(traceback.format_exception_only(type(e), e)).strip()))
        os._exit(1)
    send(sock, ("ready", os.getpid()))
    _Template(sock, kernel_pid).serve()
    os._exit(0)
