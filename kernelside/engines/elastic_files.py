"""The files nblaunch itself keeps for a run under torch's elastic launcher, made and read by descriptor.

In the run folder, ``errors/`` (owner-only) holds each of this machine's workers' ``rank<N>.pid`` (the kernel
stops workers by these, once each is proven its child) and, for a worker that failed, ``rank<N>.error`` (the
pickled error payload). Everything is made and read relative to the folder's descriptor without following a
link (``private_dir``), and a file is read only when it is a plain file of this user's with one link, so a
name swapped for a link or a FIFO inside the run folder gives nothing. torch's own per-rank logs
(``<run>/attempt_N/<local rank>/stdout.log``) are torch's to write; they are read here without following a
link at their last component and only when they are this user's plain files.

Example::

    >>> error_dir = make_error_dir(run_dir)             # <run_dir>/errors, 0700   # doctest: +SKIP
    >>> write_pid(error_dir, 3); read_pids(error_dir)   # in rank 3, then in the kernel
    [4242]
"""

from __future__ import annotations

import os
import pickle
import re
import stat

from ..private_dir import check_private, folder_fd, open_in, write_in

ERRORS = "errors"
MAX_FILE_BYTES = 1 << 24  # an error payload (traceback, message) is far smaller
_NAME = re.compile(r"rank([0-9]{1,9})\.(pid|error)")


def make_error_dir(run_dir: str) -> str:
    """``<run_dir>/errors``, made owner-only inside the run folder by its descriptor and verified; its path."""
    with folder_fd(run_dir) as fd:
        try:
            os.mkdir(ERRORS, 0o700, dir_fd=fd)
        except FileExistsError:
            pass
        sub = os.open(ERRORS, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
    path = os.path.join(run_dir, ERRORS)
    try:
        check_private(path, os.fstat(sub))
    finally:
        os.close(sub)
    return path


def _read(folder: str, name: str) -> bytes | None:
    """The bytes of ``name`` in ``folder`` if it is a plain file of this user's with one link; else None."""
    try:
        fd = open_in(folder, name, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_nlink != 1:
            return None
        return os.read(fd, MAX_FILE_BYTES)
    finally:
        os.close(fd)


def _ranks(folder: str, kind: str) -> list[int]:
    try:
        with folder_fd(folder) as fd:
            names = os.listdir(fd)
    except OSError:
        return []
    return sorted(int(m.group(1)) for n in names if (m := _NAME.fullmatch(n)) and m.group(2) == kind)


def write_pid(error_dir: str, rank: int) -> None:
    """In a worker: its pid, for the kernel to stop it by."""
    write_in(error_dir, f"rank{rank}.pid", str(os.getpid()).encode())


def read_pids(error_dir: str) -> list[int]:
    """The pids this machine's workers wrote (not yet proven to be anyone's child: the caller does that)."""
    pids = []
    for rank in _ranks(error_dir, "pid"):
        data = _read(error_dir, f"rank{rank}.pid")
        if data is not None and data.isdigit() and len(data) <= 10:
            pids.append(int(data))
    return pids


def write_error(error_dir: str, rank: int, payload) -> None:
    """In a worker that failed: its error payload."""
    write_in(error_dir, f"rank{rank}.error", pickle.dumps(payload))


def error_ranks(error_dir: str) -> list[int]:
    """The ranks that left an error file."""
    return _ranks(error_dir, "error")


def read_error(error_dir: str, rank: int):
    """Rank ``rank``'s error payload, or None when it left none (or not a file of this user's)."""
    data = _read(error_dir, f"rank{rank}.error")
    return pickle.loads(data) if data else None


def read_log_lines(path: str, n: int) -> list[str]:
    """The last ``n`` lines of one of torch's worker logs, opened without following a link, this user's only."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return []
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
            return []
        fh.seek(max(0, st.st_size - MAX_FILE_BYTES))
        return fh.read().decode("utf-8", "replace").splitlines(keepends=True)[-n:]
