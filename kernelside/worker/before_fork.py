"""What a process about to fork ranks (the kernel, the forkserver's template) looks up once for all of them.

A forked rank shares its parent's memory until it writes to it, and a walk over every loaded module writes to
every module it touches (reference counts): each such page is copied into the rank, by every rank at once, on
the cores the launch shares. So the walks a rank would make before user code runs (the modules holding tqdm's
bar classes, Lightning's interactive flags) are made once in the parent, and a rank forked before it imports
anything else takes their answers as they are.

Example::

    >>> look()          # in the kernel, just before forking ranks   # doctest: +SKIP
"""

from __future__ import annotations

from . import output_positions, rank_identity, tqdm_holders


def look() -> None:
    """Make the walks each forked rank would otherwise make of every loaded module."""
    tqdm_holders.prime()
    rank_identity.prime()
    output_positions.libc()  # the C library's handle (prctl, fflush): opening it costs a rank 0.4 ms
