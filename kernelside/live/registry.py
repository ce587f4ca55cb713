"""This kernel's live session, if any: small enough for every ``%%distributed`` cell to ask without
importing the session machinery (that comes with ``%distributed_start``).

Example::

    >>> current() is None        # no %distributed_start in this kernel yet
    True
"""

from __future__ import annotations

_current: list = [None]


def current():
    """This kernel's live session (a ``live.session.LiveSession``), or None."""
    return _current[0]


def set_current(session) -> None:
    _current[0] = session
