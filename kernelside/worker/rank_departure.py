"""A rank that leaves on its own (``sys.exit(0)`` in the launched code) while its peers still wait
for it in a collective: the peers' "connection closed" errors are its consequence, not the cause.

In the rank, ``announce()`` sends a ``left`` event (exit code, where ``sys.exit`` was called) before
the process ends. In the kernel the run recorder keeps it on the rank's report and, once every pipe
is drained, makes it the root cause when the launch then failed with peer-loss errors raised after
it left; the rank's report then shows its own exit (``exit code 0``), not the SIGTERM nblaunch sent
while it was tearing down.

Example::

    >>> announce(events, SystemExit(0))     # in the rank, as sys.exit(0) passes   # doctest: +SKIP
"""

from __future__ import annotations

import traceback

from ..short_traceback import is_nblaunch_file
from .context import stamp


def announce(events, exc: SystemExit) -> None:
    """(rank) Tell the kernel this rank is leaving on its own, and from where."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not is_nblaunch_file(f.filename)]
    code = exc.code if isinstance(exc.code, int) else 0
    where = f"sys.exit({exc.code if exc.code is not None else ''})"
    if frames:
        where += f" at {frames[-1].filename}, line {frames[-1].lineno}"
    try:
        events.send("left", {"code": code, "where": where, **stamp()})
    except Exception:
        pass  # the kernel still sees the exit status
