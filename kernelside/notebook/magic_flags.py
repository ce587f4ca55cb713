"""The flags of ``%%distributed`` and ``%distributed_start``, declared once.

Each flag is one row of a table (in the spirit of ipyparallel's shared argument groups): its
spelling, the schema key it sets, its help, and what a live session's cell does with it (``live``).
``launch_flags`` and ``cell_flags`` turn the rows into IPython ``magic_arguments`` (so ``%%distributed?``
prints them all); ``settings()`` reads parsed flags back under their schema names. From the same rows:
``SESSION_FLAGS`` (the settings a live session fixes), ``FIXED_ON_LIVE`` (every setting a live cell may
not change), ``LIVE_CELL_SETTINGS`` (what a live cell passes to its request) and ``live_cell_flags()``
(the words that list what a live cell may change).

Example::

    >>> @magic_arguments()
    ... @launch_flags
    ... def distributed_start(self, line): ...          # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import enum

from IPython.core.magic_arguments import argument, argument_group

from ..config.launch_rules import arguments as config_arguments


class OnLiveCell(enum.Enum):
    """What a ``%%distributed`` cell that runs on a live session does with a flag it gives."""

    APPLIED = "applied"  # applies to that cell, as in a one-shot cell
    SESSION = "session"  # fixed by %distributed_start for the whole session: another value is refused
    AT_START = "at start"  # the ranks took it as they started (nblaunch.yaml, kernelside.start): refused too


@dataclasses.dataclass(frozen=True)
class Flag:
    names: tuple[str, ...]
    help: str
    key: str | None = None  # the schema key it sets (None: not a launch setting)
    live: OnLiveCell = OnLiveCell.APPLIED  # what a live session's cell does with it
    type: type = str
    default: object = None
    dest: str | None = None
    metavar: str | None = None

    @property
    def attr(self) -> str:
        """The attribute argparse stores the value under."""
        return self.dest or self.names[-1].lstrip("-").replace("-", "_")

    def decorator(self):
        extra = {k: v for k, v in (("dest", self.dest), ("metavar", self.metavar)) if v is not None}
        help_text = self.help.replace("%", "%%")  # argparse expands % in help
        return argument(*self.names, type=self.type, default=self.default, help=help_text, **extra)


# shared by %%distributed and %distributed_start
LAUNCH_FLAGS = (
    Flag(
        ("-n", "--num-processes"),
        "Number of workers (default: from nblaunch.yaml, else one per GPU, or 2 without GPUs).",
        key="num_processes",
        live=OnLiveCell.SESSION,
        type=int,
    ),
    Flag(
        ("--engine",),
        "local | ray (on the Ray cluster at ray_address: Ray Train for a cell, actors for live ranks).",
        key="engine",
        live=OnLiveCell.SESSION,
    ),
    Flag(
        ("--backend",),
        "auto | nccl | gloo (auto: nccl when each rank has its own GPU).",
        key="backend",
        live=OnLiveCell.SESSION,
    ),
    Flag(
        ("--start-method",),
        "auto | fork | forkserver | spawn (auto: fork unless CUDA is initialized here, else forkserver).",
        key="start_method",
        live=OnLiveCell.SESSION,
    ),
    Flag(
        ("--mixed-precision",),
        "no | fp16 | bf16 | fp8 (read by Accelerate in the workers).",
        key="mixed_precision",
        live=OnLiveCell.SESSION,
    ),
    Flag(("--gpu-ids",), "GPUs to use: all, or indices such as 0,1.", key="gpu_ids", live=OnLiveCell.SESSION),
    Flag(("--output",), "Whose output shows in the cell: rank0 | all | none.", key="output"),
    Flag(("--progress",), "Whose progress bars show: rank0 | all.", key="progress"),
    Flag(
        ("--timeout",),
        "Stop every rank after this many seconds (%distributed_start: the default for each cell).",
        key="timeout",
        type=float,
    ),
    Flag(("--config",), "nblaunch.yaml to use instead of the one found.", metavar="PATH", live=OnLiveCell.SESSION),
    Flag(
        ("--placement-strategy",),
        "engine ray: pack | spread | strict_pack (one whole node) | strict_spread (one rank per node).",
        key="placement_strategy",
        live=OnLiveCell.SESSION,
    ),
    Flag(
        ("--port",),
        "Rendezvous port (a free one is used if it is taken).",
        key="main_process_port",
        live=OnLiveCell.SESSION,
        type=int,
    ),
)

# %%distributed only
CELL_FLAGS = (
    Flag(
        ("--metrics",),
        "on | off: whether Accelerate, Trainer, Lightning and TensorBoard logs draw the live chart.",
        key="metrics",
        live=OnLiveCell.AT_START,  # a live rank captures the frameworks' loggers once, as it starts
    ),
    Flag(
        ("--return",),
        "Comma-separated names to bring back into the notebook after the run, e.g. model,losses.",
        dest="return_names",
        metavar="NAMES",
    ),
    Flag(
        ("--return-from",),
        "Which rank's values --return brings back (default 0); all: each name becomes a list by rank.",
        default="0",
        metavar="RANK|all",
    ),
    Flag(
        ("--ranks",),
        "Live session only: run the cell on these ranks, e.g. 0 or 0,2 (default all).",
        metavar="RANKS|all",
    ),
)

ALL_FLAGS = LAUNCH_FLAGS + CELL_FLAGS
_SETTING_ATTRS = tuple(f.attr for f in ALL_FLAGS if f.key)  # where argparse puts each launch setting's value
# schema key -> the flag that sets it, for the settings a live session fixes
SESSION_FLAGS = {f.key: f.names[0] for f in ALL_FLAGS if f.key and f.live is OnLiveCell.SESSION}
# schema key -> its flag, for every setting a live cell may not change (the session's, and what its ranks took)
FIXED_ON_LIVE = {f.key: f for f in ALL_FLAGS if f.key and f.live is not OnLiveCell.APPLIED}
# the settings a live cell passes to its request (``LiveSession.run_cell``'s keywords)
LIVE_CELL_SETTINGS = tuple(f.key for f in ALL_FLAGS if f.key and f.live is OnLiveCell.APPLIED)


def live_cell_flags() -> str:
    """The flags a live session's cell may change, in words.

    Example::

        >>> live_cell_flags()
        '--output, --progress, --timeout, --return, --return-from and --ranks'
    """
    names = [f.names[-1] for f in ALL_FLAGS if f.live is OnLiveCell.APPLIED]
    return ", ".join(names[:-1]) + " and " + names[-1]


def naming_live_cell_flags(fn):
    """Write ``live_cell_flags()`` where a magic's help says ``LIVE_CELL_FLAGS`` (under ``@magic_arguments()``)."""
    fn.__doc__ = fn.__doc__.replace("LIVE_CELL_FLAGS", live_cell_flags())
    return fn


def _flags(title: str, flags):
    def decorate(fn):
        for flag in reversed(flags):  # magic_arguments lists the last decorator applied first
            fn = flag.decorator()(fn)
        return argument_group(title)(fn)

    return decorate


launch_flags = _flags("launch settings (%%distributed and %distributed_start)", LAUNCH_FLAGS)
cell_flags = _flags("per cell (%%distributed)", CELL_FLAGS)


def settings(args) -> dict:
    """The launch settings the parsed flags gave explicitly, under their schema names.

    Example::

        >>> settings(parse_argstring(DistributedMagics.distributed, "-n 2 --port 29512"))   # doctest: +SKIP
        {'num_processes': 2, 'main_process_port': 29512}
    """
    # under the flag's own name (port, not main_process_port): an invalid value's error names the flag as written
    given = {attr: getattr(args, attr) for attr in _SETTING_ATTRS if hasattr(args, attr)}
    return config_arguments("flag", **given)
