"""The processes a rank started, found and stopped by pid and start time: nothing a rank starts outlives its run.

A rank makes itself a *child subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``, ``adopt_orphans``), so what it starts
stays below it even when it leaves its session (``start_new_session=True``) or double-forks into a daemon: an
orphan is re-parented to the rank, not to init. ``descendants`` reads that tree from ``/proc`` (parent pid and
start time of every process of this user), and ``stop`` signals each process through a pidfd opened after
its start time was checked again, so a pid reused by another process is never signalled. A rank ends its tree
itself when it ends (``end_descendants``, in ``worker/entry.py``); the kernel, which may have to SIGKILL a rank,
notes the ranks' trees before it signals them and stops what is left afterwards (``engines/local_group.py``).

A process whose environment has ``NBLAUNCH_KEEP=1`` is kept, with what it starts (they inherit it): the way to
leave a daemon running on purpose. Standard library only.

Example::

    >>> adopt_orphans()                                  # in a rank, first thing
    >>> tree = descendants([os.getpid()])                # [(pid, start time), ...]
    >>> stop(tree)                                       # SIGKILL each, where it is still that process
"""

from __future__ import annotations

import ctypes
import os
import signal
import time

from .run_contract import proc_stat

KEEP_ENV = "NBLAUNCH_KEEP"  # NBLAUNCH_KEEP=1 in a process's environment: it outlives the run on purpose
PR_SET_CHILD_SUBREAPER = 36


def adopt_orphans() -> bool:
    """Make this process the reaper of every orphan below it (Linux); False where that is not possible."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _kept(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f"{KEEP_ENV}=1".encode() in f.read().split(b"\0")
    except OSError:
        return False


def descendants(roots, *, keep: bool = True) -> list[tuple[int, int]]:
    """Every live process below the pids ``roots`` (not the roots), as (pid, start time); what has
    ``NBLAUNCH_KEEP=1`` is left out, with its own descendants, unless ``keep`` is False."""
    children: dict[int, list[tuple[int, int, str]]] = {}
    uid = os.getuid()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
        except OSError:
            continue
        st = proc_stat(pid)
        if st is not None:
            children.setdefault(st[0], []).append((pid, st[1], st[2]))
    found, todo = [], list(roots)
    while todo:
        for pid, start, state in children.get(todo.pop(), ()):
            if keep and _kept(pid):
                continue
            if state != "Z":
                found.append((pid, start))
            todo.append(pid)
    return found


def stop(procs, sig: int = signal.SIGKILL) -> int:
    """Send ``sig`` to each (pid, start time) that is still that process; how many were signalled."""
    sent = 0
    for pid, start in procs:
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            continue  # gone
        try:
            st = proc_stat(pid)
            if st is None or st[1] != start:
                continue  # the pid is another process's now
            signal.pidfd_send_signal(fd, sig)
            sent += 1
        except OSError:
            pass
        finally:
            os.close(fd)
    return sent


def has_children(pid: int) -> bool:
    """Whether ``pid`` has a child process (a zombie included), from its threads' ``children`` files; True where
    they cannot be read. Every process below a child subreaper is below one of its children (an orphan comes back
    to it), so no child means nothing below: the rank's end then needs no look at every process of the machine."""
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                if f.read().strip():
                    return True
    except OSError:
        return True
    return False


def end_descendants(timeout: float = 2.0) -> None:
    """At a rank's end: SIGKILL every process below this one (kept ones excepted) and reap what was ours,
    until none is left or ``timeout`` passes (an orphan comes back to us as its parent dies)."""
    me = os.getpid()
    if not has_children(me):
        return  # (the common case: a rank that started nothing, or whose children are all reaped)
    deadline = time.monotonic() + timeout
    while True:
        tree = descendants([me])
        stop(tree)
        _reap()
        if not tree or time.monotonic() >= deadline:
            return
        time.sleep(0.005)


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
