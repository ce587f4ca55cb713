"""IPython magics: ``%%distributed``, ``%distributed_config``, ``%distributed_last``, ``%distributed_export``.

The magics only parse and delegate: the flags (declared once, ``magic_flags``) become a
``CellRequest`` for the cell's target (``cell_targets``: its own launch, through the same
``launch()`` that ``notebook_launcher()`` uses, or the live session), whose ``CellResult`` the
notebook receives.

Example (in a notebook)::

    %load_ext kernelside

    %%distributed -n 2 --return model
    model = DDP(Net())
    ...
"""

from __future__ import annotations

import argparse
import functools

from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from .. import interrupts
from ..config import resolve_config
from ..config.launch_rules import arguments as config_arguments
from ..errors import LaunchConfigError
from ..kernel_shell import cell_label
from ..launch.runner import last_report
from ..live import registry as live_session
from .cell_targets import CellRequest, cell_target
from .config_report import config_report
from .export import CellRecord, export_cell, export_function, last_cell
from .magic_flags import cell_flags, launch_flags, naming_live_cell_flags, settings


def _names(spec: str | None) -> tuple[str, ...]:
    if not spec:
        return ()
    names = tuple(n.strip() for n in spec.split(",") if n.strip())
    bad = [n for n in names if not n.isidentifier()]
    if bad:
        raise LaunchConfigError("--return", spec, "comma-separated Python names, e.g. --return model,losses")
    return names


def _return_from(spec: str) -> int | str:
    if spec == "all":
        return "all"
    if spec.isdigit():
        return int(spec)
    raise LaunchConfigError("--return-from", spec, "a rank number (0, 1, ...) or 'all'")


def _cell_flags(line: str) -> argparse.Namespace:
    """The flags of a ``%%distributed`` line, a fresh copy for each cell (their values are str, int, float or None)."""
    return argparse.Namespace(**vars(_parsed_flags(line)))


# Parsed once per text: a live session runs the same cell (and its first line) again and again, and argparse costs
# a cell more than anything else the magic does before the ranks get it. A line with bad flags raises each time
# (lru_cache keeps no exception).
@functools.lru_cache(maxsize=64)
def _parsed_flags(line: str) -> argparse.Namespace:
    return parse_argstring(DistributedMagics.distributed, line)


@magics_class
class DistributedMagics(Magics):
    @magic_arguments()
    @naming_live_cell_flags
    @launch_flags
    @cell_flags
    @cell_magic
    @interrupts.deferring()
    def distributed(self, line, cell):
        """Run this cell on N workers with torch.distributed set up; rank 0's output streams here.

        Inside the cell: the notebook's names plus ``rank``, ``local_rank``, ``world_size`` and
        ``device``. The last expression (on rank 0) is the cell's result; ``--return`` names are
        assigned in the notebook afterwards.

        Live ranks: after ``%distributed_start -n 4`` (same flags as here), every ``%%distributed``
        cell runs on the same ranks, which keep their state: names a cell assigns stay on the ranks
        for later cells; other names come from the notebook's current value (sent only when changed).
        Per cell, LIVE_CELL_FLAGS apply; a flag
        that contradicts the session (-n 8 on a 4-rank session) is an error. A failure or ■ stops the
        cell on every rank; ranks that come back keep their state, and a rank stuck in a collective
        means the session is restarted (said so in the error). ``%distributed_status``,
        ``%distributed_push NAMES``, ``%distributed_restart``, ``%distributed_stop``. Without a live
        session, each cell starts and ends its own workers.
        """
        args = _cell_flags(line)
        request = CellRequest(
            cell,
            label=cell_label(self.shell),
            return_names=_names(args.return_names),
            return_from=_return_from(args.return_from),
            ranks=args.ranks,
        )
        result = cell_target(settings(args), args.config).run(request, self.shell.user_ns)
        self.shell.user_ns.update(result.names)
        return result.value

    @magic_arguments()
    @argument("path", metavar="NAME.py", help="The script to write (data the code uses goes to NAME.data.pkl).")
    @argument("function", nargs="?", default=None, help="Export this notebook function instead of the last cell.")
    @argument("--args", default=None, metavar="EXPR", help="The function's arguments, a tuple expression: '(0.1,)'.")
    @argument("-n", "--num-processes", type=int, default=None, help="num_processes (total over all machines).")
    @argument("--port", type=int, default=None, help="Rendezvous port in the command (default: config, else 29500).")
    @argument("--config", default=None, metavar="PATH", help="nblaunch.yaml to use instead of the one found.")
    @line_magic
    def distributed_export(self, line):
        """Write the last %%distributed cell (or a notebook function) as a script, with the torchrun and
        accelerate launch commands that run it with the current configuration.

        Example: ``%distributed_export train.py`` or ``%distributed_export train.py train --args "(0.1,)"``.
        """
        args = parse_argstring(self.distributed_export, line)
        ns = self.shell.user_ns
        overrides = config_arguments("flag", num_processes=args.num_processes, port=args.port)
        if args.function is None:
            record = last_cell()
            if record is None:
                raise LaunchConfigError(
                    None,
                    None,
                    None,
                    message="no %%distributed cell has run in this kernel yet: run one, or name a notebook function "
                    "(%distributed_export train.py train). Nothing was written.",
                )
            config = args.config or record.config
            record = CellRecord(record.body, record.label, {**record.arguments, **overrides}, config)
            exported = export_cell(args.path, record, ns)
        else:
            if args.function not in ns:
                raise LaunchConfigError("function", args.function, "the name of a function defined in the notebook")
            text = args.args or "()"
            if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":  # IPython keeps the quotes
                text = text[1:-1]
            call_args = eval(text, ns)  # noqa: S307 - the user's own expression
            if not isinstance(call_args, tuple):
                call_args = (call_args,)
            exported = export_function(
                args.path, ns[args.function], args=call_args, user_ns=ns, arguments=overrides, config=args.config
            )
        print(exported)
        return None

    @line_magic
    def distributed_config(self, line):
        """Show the configuration the next launch would use: what differs from the defaults first and where it
        comes from, values a launch would refuse, then the defaults and the plan."""
        path = line.strip() or None
        session = live_session.current()
        if session is not None:
            print(f"live session: {session.describe()} (cells run on it; %distributed_status for its ranks)")
        else:
            print("live session: none (each %%distributed cell starts its own workers; %distributed_start for one)")
        print(config_report(resolve_config({}, config=path, lenient=True)))

    @line_magic
    def distributed_last(self, line):
        """The last run's report: per-rank exit status, start-up and wall time, log files, metrics."""
        report = last_report()
        if report is None:
            print("No nblaunch run in this kernel yet.")
        return report


# A misspelt or shortened flag is an error, never silently taken for another flag.
DistributedMagics.distributed.parser.allow_abbrev = False
DistributedMagics.distributed_export.parser.allow_abbrev = False


def register(ipython) -> None:
    from .debug_magic import install as install_debug
    from .live_magics import register as register_live

    ipython.register_magics(DistributedMagics)
    register_live(ipython)
    install_debug(ipython)
