"""Where a ``%%distributed`` cell runs, and what it gives back: the public API the magic calls.

A cell runs on a *target*: its own launch (``OneShotCells``: workers started and ended for it, through
the same ``launch()`` as ``notebook_launcher()``) or this kernel's live session (``LiveCells``: the
ranks kept across cells). ``cell_target()`` picks the one a cell run now would use; both take a
``CellRequest`` and return a ``CellResult``, so the magic only parses and calls, as ipyparallel's
``%%px`` calls its view.

Example::

    >>> target = cell_target({"num_processes": 2})                                      # doctest: +SKIP
    >>> result = target.run(CellRequest("x = rank * 2\\nx + 1", return_names=("x",)), globals())  # doctest: +SKIP
    >>> result.value, result.names                                                       # doctest: +SKIP
    (1, {'x': 0})
"""

from __future__ import annotations

import dataclasses

from ..config import resolve_config
from ..errors import LaunchConfigError
from ..launch.request import LaunchRequest
from ..launch.runner import launch
from ..live import registry as live_registry
from .cell import prepare_cell
from .export import CellRecord, remember_cell
from .magic_flags import FIXED_ON_LIVE, LIVE_CELL_SETTINGS, OnLiveCell, live_cell_flags


@dataclasses.dataclass(frozen=True)
class CellRequest:
    """One cell to run. ``ranks``: live session only, a tuple or a ``--ranks`` text ("0,2", "all")."""

    body: str
    label: str = "cell"  # how errors and tracebacks name the cell, e.g. In[3]
    return_names: tuple[str, ...] = ()
    return_from: int | str = 0  # a rank, or "all": each --return name becomes a list by rank
    ranks: tuple[int, ...] | str | None = None
    line_offset: int = 1  # lines above the body in the notebook cell (the %%distributed line)


@dataclasses.dataclass(frozen=True)
class CellResult:
    """What a cell gives the notebook: its result (its first rank's last expression) and the --return names."""

    value: object
    names: dict
    ranks: tuple[int, ...]  # the ranks it ran on

    @classmethod
    def gather(cls, values: list, request: CellRequest, ranks: tuple[int, ...], return_from) -> CellResult:
        """From the ranks' ``CellValues`` (indexed by rank); a --return name a rank did not define is an error."""
        first = ranks[0]
        chosen = values[first] if return_from == "all" else values[return_from]
        if chosen.missing:
            rank = first if return_from == "all" else return_from
            raise LaunchConfigError(
                "--return",
                ",".join(chosen.missing),
                None,
                message=f"--return: rank {rank} did not define {', '.join(repr(m) for m in chosen.missing)}. Names "
                f"that exist after the cell: {', '.join(chosen.available) or '(none)'}. The other names were "
                "not assigned either.",
            )
        if return_from == "all":
            names = {name: [values[r].returned[name] for r in ranks] for name in request.return_names}
        else:
            names = dict(chosen.returned)
        return cls(values[first].last, names, ranks)


class OneShotCells:
    """Each cell starts and ends its own workers (``launch()``), with these launch settings."""

    def __init__(self, arguments: dict, config: str | None = None):
        self.arguments, self.config = dict(arguments), config

    def run(self, request: CellRequest, namespace: dict) -> CellResult:
        """Run the cell on fresh workers reading ``namespace`` (the notebook's); see ``CellResult``."""
        if request.ranks is not None:
            raise LaunchConfigError(
                "--ranks",
                request.ranks,
                None,
                message="--ranks needs a live session (%distributed_start): a one-shot cell runs on every rank.",
            )
        program = prepare_cell(
            request.body, cell_label=request.label, line_offset=request.line_offset, return_names=request.return_names
        )
        remember_cell(CellRecord(request.body, request.label, self.arguments, self.config))
        return_from = request.return_from
        req = LaunchRequest(
            fn=program,
            arguments=self.arguments,
            config=self.config,
            namespace=namespace,
            return_all=return_from != 0,
            return_rank=return_from if isinstance(return_from, int) else None,
        )
        outcome = launch(req)
        values = outcome.values if req.return_all else [outcome.value]
        return CellResult.gather(values, request, tuple(range(len(values))), return_from)


class LiveCells:
    """Cells run on a live session's ranks (``live.session.LiveSession``), which keep their names."""

    def __init__(self, session, arguments: dict, config: str | None = None):
        self.session, self.arguments, self.config = session, dict(arguments), config

    def run(self, request: CellRequest, namespace: dict) -> CellResult:
        """Run the cell on the session's ranks (``namespace`` must be the notebook's: the session reads it)."""
        session = self.session
        check_session_flags(session, self.arguments, self.config)
        world = session.plan.num_processes
        ranks = parse_ranks(request.ranks, world)
        chosen = ranks if ranks is not None else tuple(range(world))
        return_from = request.return_from
        if return_from == 0 and 0 not in chosen:
            return_from = chosen[0]  # the default follows the cell to the ranks it runs on
        if isinstance(return_from, int) and return_from not in chosen:
            raise LaunchConfigError("--return-from", return_from, f"one of the ranks the cell runs on: {chosen}")
        program = prepare_cell(
            request.body, cell_label=request.label, line_offset=request.line_offset, return_names=request.return_names
        )
        senders = set(chosen) if return_from == "all" else {chosen[0], return_from}
        per_cell = {key: self.arguments.get(key) for key in LIVE_CELL_SETTINGS}  # magic_flags: OnLiveCell.APPLIED
        outcome = session.run_cell(program, return_from=tuple(sorted(senders)), ranks=ranks, **per_cell)
        return CellResult.gather(outcome.values, request, chosen, return_from)


def cell_target(arguments: dict | None = None, config: str | None = None) -> OneShotCells | LiveCells:
    """Where a cell run now goes: this kernel's live session when one is running, else a launch of its own.

    Example::

        >>> type(cell_target({"num_processes": 2})).__name__      # no live session in this process
        'OneShotCells'
    """
    session = live_registry.current()
    if session is not None:
        return LiveCells(session, arguments or {}, config)
    return OneShotCells(arguments or {}, config)


def parse_ranks(spec, world: int) -> tuple[int, ...] | None:
    """``--ranks 0`` / ``0,2`` / ``all`` (or a tuple) → the ranks a cell runs on (None: all).

    Example::

        >>> parse_ranks("2,0", 4), parse_ranks("all", 4)
        ((0, 2), None)
    """
    if spec is None or spec == "all":
        return None
    try:
        parts = spec.split(",") if isinstance(spec, str) else spec
        ranks = tuple(sorted({int(p) for p in parts if str(p).strip()}))
    except (TypeError, ValueError):
        ranks = ()
    if not ranks or any(not 0 <= r < world for r in ranks):
        raise LaunchConfigError(
            "--ranks", spec, f"rank numbers of this {world}-rank live session (0..{world - 1}) or 'all'"
        )
    return ranks


def check_session_flags(session, arguments: dict, config: str | None) -> None:
    """A per-cell setting that contradicts the session is an error that names both values; nothing runs.

    Example::

        >>> check_session_flags(session, {"num_processes": 8}, None)   # doctest: +SKIP
        LaunchConfigError: -n 8 contradicts the live session (num_processes is 2 there: ...)
    """
    if config is not None and config != session.config:
        raise LaunchConfigError(
            "--config",
            config,
            None,
            message=f"--config {config} contradicts the live session, started with config {session.config}. "
            "A live session's configuration is fixed: %distributed_stop, then %distributed_start with it. Nothing ran.",
        )
    given = {k: v for k, v in arguments.items() if k in FIXED_ON_LIVE}
    if not given:
        return
    cell_cfg = resolve_config({**session.arguments, **given}, config=session.config)
    plan = session.plan
    actual = {"num_processes": plan.num_processes, "backend": plan.backend, "start_method": plan.start_method}
    for key, value in given.items():
        have = actual.get(key, session.cfg.values.get(key))
        want = cell_cfg.values.get(key, value)
        if key in ("backend", "start_method") and want == "auto":
            continue
        if want != have:
            flag = FIXED_ON_LIVE[key]
            how = (
                "Restart the session with other flags (%distributed_stop, %distributed_start) to change it."
                if flag.live is OnLiveCell.SESSION
                else f"The live ranks took it as they started: %distributed_stop, then %distributed_start with {key}: "
                f"{want} in nblaunch.yaml (or kernelside.start({key}={want!r})) to change it."
            )
            raise LaunchConfigError(
                flag.names[0],
                value,
                None,
                message=f"{flag.names[0]} {value} contradicts the live session ({key} is {have!r} there: "
                f"{session.describe()}). Per cell, only {live_cell_flags()} can change. {how} Nothing ran.",
            )
