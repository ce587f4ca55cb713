"""This kernel's live session, if any: small enough for every ``%%distributed`` cell to ask without
importing the session machinery (that comes with ``%distributed_start``).

Example::

    >>> current() is None        # no %distributed_start in this kernel yet
    True
"""

from __future__ import annotations

from ..errors import LaunchError


class _KernelSession:
    session = None


# Global on purpose: one live session per kernel, and a kernel is one process; every %%distributed cell,
# %distributed_* magic and the panel's Stop must reach the same one.
KERNEL_SESSION = _KernelSession()


def current():
    """This kernel's live session (a ``live.session.LiveSession``), or None."""
    return KERNEL_SESSION.session


def set_current(session) -> None:
    KERNEL_SESSION.session = session


def refuse_a_second() -> None:
    """Before a session starts: a LaunchError if this kernel's session is still up (one at a time); one
    stopped from the launch panel between cells is forgotten here."""
    running = current()
    if running is not None and not running.world.up:
        set_current(None)
    elif running is not None:
        raise LaunchError(
            "nblaunch: a live session is already running in this kernel "
            f"({running.describe()}). Stop it first (%distributed_stop), or restart it (%distributed_restart)."
        )
