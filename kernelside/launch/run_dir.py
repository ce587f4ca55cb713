"""Each launch's own folder for its logs: ``run-<time>-…`` under ``$TMPDIR/nblaunch-<uid>/`` (or ``log_dir``).

The folder is created owner-only (``mkdtemp``), locked (``flock`` on ``.in-use``) for as long as
the launch runs, and the newest ``KEEP_RUN_LOGS`` folders are kept: pruning never removes a
folder that is in use.

Example::

    >>> with run_log_dir(None) as path:      # doctest: +SKIP
    ...     open(os.path.join(path, "rank0.log"), "ab")
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import os
import shutil
import tempfile

# the folder's layout is the contract the Jupyter server reads by; these names are its
from ..run_contract import IN_USE_FILE, RUN_PREFIX, runs_base

__all__ = ["IN_USE_FILE", "KEEP_RUN_LOGS", "in_use", "run_log_dir", "runs_base"]

KEEP_RUN_LOGS = 50  # per log folder, the newest runs' logs are kept; older run folders are removed


@contextlib.contextmanager
def run_log_dir(log_dir: str | None):
    """A fresh ``run-<time>-…`` folder for this launch's logs, locked for as long as the launch runs."""
    base = runs_base(log_dir)
    os.makedirs(base, exist_ok=True)
    runs = sorted(e.path for e in os.scandir(base) if e.is_dir(follow_symlinks=False) and e.name.startswith(RUN_PREFIX))
    for old in runs[: max(0, len(runs) - KEEP_RUN_LOGS + 1)]:  # names sort by their timestamp
        if not in_use(old):
            shutil.rmtree(old, ignore_errors=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = tempfile.mkdtemp(prefix=f"{RUN_PREFIX}{stamp}-", dir=base)
    fd = os.open(os.path.join(path, IN_USE_FILE), os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield path
    finally:
        os.close(fd)


def in_use(run_dir: str) -> bool:
    """True while the launch that owns ``run_dir`` is running."""
    try:
        fd = os.open(os.path.join(run_dir, IN_USE_FILE), os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
