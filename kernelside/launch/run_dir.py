"""Each launch's own folder for its logs: ``run-<time>-…`` under ``$TMPDIR/nblaunch-<uid>/`` (or ``log_dir``).

The base is made owner-only (0700) and verified on every launch and live start, before a rank starts
(``private_dir.open_private_dir``: a real folder of this user's, writable by nobody else, opened without
following a link); anything else is refused with a ``LaunchError`` that names the path and what to do.
The run folder is made inside the open base by descriptor (0700), and the launch gets it as an
``OpenFolder``: its logs, times and state file are made relative to that descriptor (0600), so a path
swapped during the launch changes nothing. The folder is locked (``flock`` on ``.in-use``) for as long as
the launch runs, and the newest ``KEEP_RUN_LOGS`` folders are kept: pruning never removes a folder in use.

Example::

    >>> with run_log_dir(None) as path:      # doctest: +SKIP
    ...     os.close(open_in(path, "rank0.log", os.O_WRONLY | os.O_CREAT))
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import os
import secrets
import shutil

from ..errors import LaunchError
from ..private_dir import OpenFolder, UnsafeFolderError, open_in, open_private_dir

# the folder's layout is the contract the Jupyter server reads by; these names are its
from ..run_contract import IN_USE_FILE, RUN_PREFIX, runs_base

__all__ = ["IN_USE_FILE", "KEEP_RUN_LOGS", "in_use", "open_runs_base", "run_log_dir", "runs_base"]

KEEP_RUN_LOGS = 50  # per log folder, the newest runs' logs are kept; older run folders are removed
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def open_runs_base(log_dir: str | None) -> int:
    """The run-folder base of ``log_dir`` (``runs_base``), made owner-only if missing and verified: a descriptor.

    Raises ``LaunchError`` naming the path, what is wrong with it and what to do, when it is not a private folder.

    Example::

        >>> os.close(open_runs_base(None))   # $TMPDIR/nblaunch-<uid>, mode 0700   # doctest: +SKIP
    """
    base = runs_base(log_dir)
    try:
        parent = os.path.dirname(os.path.abspath(base))
        if log_dir:  # a log_dir of the user's may be new, parents and all; the default's parent is $TMPDIR
            os.makedirs(parent, exist_ok=True)
        return open_private_dir(base, create=True)
    except UnsafeFolderError as e:
        where = "log_dir" if log_dir else "the run-folder base"
        instead = "another log_dir" if log_dir else "log_dir to a folder of your own, or TMPDIR to another folder"
        raise LaunchError(
            f"nblaunch: {where} {e.path} {e.problem}; {e.remedy}, or set {instead} (log_dir: in nblaunch.yaml, the "
            "side panel or the log_dir argument). Nothing was started."
        ) from None
    except OSError as e:
        raise LaunchError(
            f"nblaunch: cannot make the folder for this run's logs in {base} ({e.strerror or e}): set log_dir "
            "(nblaunch.yaml, the side panel or the log_dir argument) to a folder you can write. Nothing was started."
        ) from None


@contextlib.contextmanager
def run_log_dir(log_dir: str | None):
    """A fresh ``run-<time>-…`` folder (an ``OpenFolder``) for this launch's logs, locked while the launch runs."""
    base = runs_base(log_dir)
    base_fd = open_runs_base(log_dir)
    try:
        _prune(base, base_fd)
        folder = _new_run_folder(base, base_fd)
    finally:
        os.close(base_fd)
    try:
        fd = open_in(folder, IN_USE_FILE, os.O_CREAT | os.O_RDWR)
    except BaseException:
        folder.close()
        raise
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield folder
    finally:
        os.close(fd)
        folder.close()


def _prune(base: str, base_fd: int) -> None:
    with os.scandir(base_fd) as entries:  # the verified folder itself, not whatever the path names now
        runs = sorted(e.name for e in entries if e.name.startswith(RUN_PREFIX) and e.is_dir(follow_symlinks=False))
    for old in runs[: max(0, len(runs) - KEEP_RUN_LOGS + 1)]:  # names sort by their timestamp
        path = os.path.join(base, old)
        if not in_use(path):
            shutil.rmtree(path, ignore_errors=True)  # (never follows a link: the fd-based rmtree)


def _new_run_folder(base: str, base_fd: int) -> OpenFolder:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    for _ in range(100):
        name = f"{RUN_PREFIX}{stamp}-{secrets.token_hex(4)}"
        try:
            os.mkdir(name, 0o700, dir_fd=base_fd)
        except FileExistsError:
            continue
        fd = os.open(name, _DIR_FLAGS, dir_fd=base_fd)
        os.fchmod(fd, 0o700)  # whatever the umask
        return OpenFolder(os.path.join(base, name), fd)
    raise LaunchError(f"nblaunch: could not make a new run folder in {base} (100 names taken). Nothing was started.")


def in_use(run_dir: str) -> bool:
    """True while the launch that owns ``run_dir`` is running."""
    try:
        fd = open_in(run_dir, IN_USE_FILE, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
