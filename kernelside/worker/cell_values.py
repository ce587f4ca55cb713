"""What one rank gives back from a ``%%distributed`` cell: a named type, shared by the cell program that
makes it (``notebook.cell``), the gather of sharded values (``sharded_results``) and the kernel side that
brings it into the notebook (``notebook.cell_targets``).

Example::

    >>> CellValues(last=3, returned={"x": 1}).roots()[1]
    [(3, "the cell's result"), (1, 'x')]
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class CellValues:
    last: object  # the cell's last expression (None when there is none)
    returned: dict  # the --return names the rank defined, by name
    missing: list = dataclasses.field(default_factory=list)  # --return names the rank did not define
    available: list = dataclasses.field(default_factory=list)  # the rank's names, listed only when some are missing

    def roots(self) -> tuple[list[int], list[tuple[object, str]]]:
        """(the containers, the values by the name the user knows them by): for the gather of sharded values."""
        named = [(self.last, "the cell's result")] + [(v, k) for k, v in self.returned.items()]
        return [id(self), id(self.returned)], named
