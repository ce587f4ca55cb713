"""The kernel's side of the forkserver: one template process (``worker.forkserver_template``) per
kernel, started as a fresh interpreter, from which local ranks are forked on request.

Under ``start_method="forkserver"`` (which ``auto`` picks once CUDA is initialized in the kernel) a
rank starts as fast as a fork of a process that has torch imported, yet inherits nothing of the
kernel: the work travels by cloudpickle in a memfd as under spawn, and the kernel's working
directory, ``sys.path`` and environment at the time of the launch go with each request.

The rank is the template's child: its pid, pidfd and process group work from the kernel as for
its own children (``pidfd_open`` and ``killpg`` take any pid of ours), but its exit status can only
be read by the template, which reports it (``exit_status``) and reaps it when told (``release``).

Example::

    >>> t = template_for_launch(sys.stdout)      # the running template, or None: use spawn   # doctest: +SKIP
    >>> pid = t.fork(payload, pipes, memfd)
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import time

from .. import interrupts
from ..debugger.undebugged import ranks_start_undebugged
from ..worker.forkserver_template import TEMPLATE_COMMAND, TEMPLATE_MARK, receive, send
from .contract import ExitStatus

READY_TIMEOUT_S = 180.0  # importing torch in the template; a loaded machine takes its time
EXIT_REPORT_TIMEOUT_S = 5.0  # the template reports an ended rank within milliseconds


class TemplateUnavailable(RuntimeError):
    """The template could not start, or died while asked for a rank."""


class Template:
    """A running template process and the socket the kernel talks to it on."""

    def __init__(self, proc: subprocess.Popen, sock: socket.socket):
        self.proc, self.sock = proc, sock
        self.ready = False
        self.failure: str | None = None
        self.replies: list[tuple] = []
        self.exits: dict[int, ExitStatus] = {}

    @classmethod
    def start(cls) -> Template:
        """Start the template (without waiting for its imports: ``wait_ready()`` does)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
        try:
            with ranks_start_undebugged():
                proc = subprocess.Popen(
                    [sys.executable, "-c", TEMPLATE_COMMAND, TEMPLATE_MARK, str(theirs.fileno()), str(os.getpid())],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    pass_fds=(theirs.fileno(),),
                    env=env,
                    start_new_session=True,  # the kernel's interrupt (sent to its process group) is not ours
                    close_fds=True,
                )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.set_inheritable(False)
        return cls(proc, ours)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None and self.failure is None

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Return once the template has its imports; TemplateUnavailable if it failed or died. ■ meanwhile stops
        the launch at once (``interrupts.check``); the template goes on starting, for the next launch."""
        deadline = time.monotonic() + timeout
        while not self.ready:
            if self.failure is not None:
                raise TemplateUnavailable(self.failure)
            interrupts.check()
            left = deadline - time.monotonic()
            if left <= 0:
                raise TemplateUnavailable(f"it was not ready after {timeout:.0f} s")
            self._pump(min(left, 1.0), wake=interrupts.wake_fd())
            if not self.ready and self.proc.poll() is not None and self.failure is None:
                self.failure = f"it exited ({_describe(self.proc.returncode)}) before it was ready"

    def fork(self, request: dict, fds: tuple[int, ...]) -> int:
        """Fork one rank with these fds (stdout, stderr, events, replies, memfd[, requests]); its pid."""
        self.wait_ready()
        try:
            send(self.sock, ("fork", request), fds)
        except OSError as e:
            self.failure = f"it did not take the request ({e})"
            raise TemplateUnavailable(self.failure) from None
        while not self.replies:
            if self.failure is not None:
                raise TemplateUnavailable(self.failure)
            self._pump(1.0)
        reply = self.replies.pop(0)
        if reply[0] != "forked":
            raise TemplateUnavailable(reply[1])
        return reply[1]

    def exit_status(self, pid: int, pidfd: int | None) -> ExitStatus | None:
        """The rank's exit status once it has ended (None while it runs), as the template reports it."""
        self._pump(0)
        if pid in self.exits:
            return self.exits[pid]
        if pidfd is None or not select.select([pidfd], [], [], 0)[0]:
            return None
        deadline = time.monotonic() + EXIT_REPORT_TIMEOUT_S  # it has ended: the report is on its way
        while pid not in self.exits and self.failure is None and time.monotonic() < deadline:
            self._pump(0.1)
        # a template gone too: its ranks got its parent-death SIGKILL
        return self.exits.get(pid, ExitStatus(None, signal.SIGKILL))

    def release(self, pid: int) -> None:
        """The kernel is done with the rank (no more signals to its process group): the template reaps it."""
        self.exits.pop(pid, None)
        try:
            send(self.sock, ("release", pid))
        except OSError:
            pass  # a template that is gone has taken its zombies with it

    def close(self) -> None:
        """End the template (its ranks with it) and reap it."""
        self.sock.close()
        try:
            self.proc.wait(2.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def _pump(self, timeout: float, wake: int | None = None) -> None:
        """Read what the template sent within ``timeout`` seconds (0: only what is there); ``wake`` readable
        (■ pressed) ends the wait early."""
        wait = timeout
        watched = [self.sock] + ([wake] if wake is not None else [])
        while self.failure is None and self.sock in select.select(watched, [], [], wait)[0]:
            wait = 0
            watched = [self.sock]
            try:
                message, fds = receive(self.sock)
            except OSError as e:
                message, fds = None, []
                self.failure = f"its socket failed ({e})"
            for fd in fds:
                os.close(fd)
            if message is None:
                try:
                    code = self.proc.wait(1.0)  # its socket closes as it exits
                except subprocess.TimeoutExpired:
                    code = None
                when = "" if self.ready else " before it was ready"
                self.failure = self.failure or f"it exited ({_describe(code)}){when}"
            elif message[0] == "ready":
                self.ready = True
            elif message[0] == "exit":
                self.exits[message[1]] = ExitStatus(message[2], message[3])
            elif message[0] == "failed" and not self.ready:
                self.failure = f"its start failed: {message[1]}"
            else:
                self.replies.append(message)


def _describe(returncode: int | None) -> str:
    if returncode is None:
        return "still running"
    if returncode < 0:
        return f"signal {signal.Signals(-returncode).name}"
    return f"exit code {returncode}"


# The one template of this kernel, and whether starting one has failed: process-wide by nature (a
# second template would be a second copy of torch in memory), so a registry, not per-launch state.
_registry: dict = {"template": None, "refused_because": None}


def prestart() -> None:
    """Start the template in the background now, so that the first launch that needs it finds it ready.

    >>> prestart(); running_template().pid > 0      # doctest: +SKIP
    True
    """
    if _registry["template"] is None and _registry["refused_because"] is None:
        try:
            _registry["template"] = Template.start()
        except OSError as e:
            _registry["refused_because"] = f"it could not be started ({e})"


def prestart_if_useful() -> None:
    """After ``%load_ext kernelside``: start the template in the background on a machine with an NVIDIA GPU,
    where CUDA may well be initialized in the kernel before a launch (and ``auto`` then uses the template).
    Without one, CUDA can never be initialized here, so the template starts only when a launch asks for it.

    >>> prestart_if_useful()      # after the cell that loaded kernelside   # doctest: +SKIP
    """
    try:
        has_gpu = bool(os.listdir(_NVIDIA_GPUS))
    except OSError:
        has_gpu = False
    if has_gpu:
        prestart()


_NVIDIA_GPUS = "/proc/driver/nvidia/gpus"  # one folder per GPU the driver sees; read without touching CUDA


def running_template() -> Template | None:
    """This kernel's template if one was started (tests and the bench read its pid).

    >>> running_template() is None      # before any launch asked for it, without a GPU   # doctest: +SKIP
    True
    """
    return _registry["template"]


def template_for_launch(out) -> Template | None:
    """A ready template for a launch, or None: the launch uses spawn. A template that died is replaced,
    and a template that cannot start means spawn from now on; each is said once, on ``out``.

    >>> t = template_for_launch(sys.stdout)      # doctest: +SKIP
    >>> method = "forkserver" if t is not None else "spawn"
    """
    if _registry["refused_because"] is not None:
        return None
    t = _registry["template"]
    if t is not None and not t.alive():
        gone = t.failure or f"it ended ({_describe(t.proc.returncode)})"
        _end(t)
        _registry["template"] = None
        out.write(f"nblaunch: the forkserver template (pid {t.pid}) is gone ({gone}); starting a new one.\n")
    if _registry["template"] is None:
        prestart()
    t = _registry["template"]
    if t is None:
        return _give_up(out, _registry["refused_because"])
    try:
        t.wait_ready()
    except TemplateUnavailable as e:
        _end(t)
        _registry["template"] = None
        return _give_up(out, str(e))
    return t


def _give_up(out, why: str) -> None:
    _registry["refused_because"] = why
    out.write(
        f"nblaunch: the forkserver template could not start ({why}); this and later launches use spawn "
        "(slower: every rank imports torch afresh).\n"
    )
    return None


def _end(t: Template) -> None:
    try:
        t.close()
    except OSError:
        pass
