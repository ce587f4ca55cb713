"""IPython magics: ``%%distributed``, ``%distributed_config``, ``%distributed_last``, ``%distributed_export``.

The magics only parse and delegate: the cell becomes a ``CellProgram`` and goes through the
same ``engine.launch()`` that ``notebook_launcher()`` uses.

Example (in a notebook)::

    %load_ext kernelside

    %%distributed -n 2 --return model
    model = DDP(Net())
    ...
"""

from __future__ import annotations

from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from ..config import resolve_config
from ..config.launch_rules import arguments as config_arguments
from ..errors import LaunchConfigError
from ..launch.engine import last_report, launch
from ..launch.request import LaunchRequest
from ..live import registry as live_session
from .cell import prepare_cell, ship_namespace
from .cell_label import cell_label
from .config_report import config_report
from .export import CellRecord, export_cell, export_function, last_cell, remember_cell
from .live_magics import flag_arguments, run_live_cell


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


@magics_class
class DistributedMagics(Magics):
    @magic_arguments()
    @argument(
        "-n",
        "--num-processes",
        type=int,
        default=None,
        help="Number of workers (default: from nblaunch.yaml, else one per GPU, or 2 without GPUs).",
    )
    @argument("--backend", default=None, help="auto | nccl | gloo (auto: nccl when each rank has its own GPU).")
    @argument("--start-method", default=None, help="auto | fork | forkserver | spawn (see start_method).")
    @argument("--mixed-precision", default=None, help="no | fp16 | bf16 | fp8 (read by Accelerate in the workers).")
    @argument("--gpu-ids", default=None, help="GPUs to use: all, or indices such as 0,1.")
    @argument("--output", default=None, help="Whose output shows in the cell: rank0 | all | none.")
    @argument("--progress", default=None, help="Whose progress bars show: rank0 | all.")
    @argument(
        "--metrics",
        default=None,
        help="on | off: whether Accelerate, Trainer, Lightning and TensorBoard logs draw the live chart.",
    )
    @argument(
        "--return",
        dest="return_names",
        default=None,
        metavar="NAMES",
        help="Comma-separated names to bring back into the notebook after the run, e.g. model,losses.",
    )
    @argument(
        "--return-from",
        default="0",
        metavar="RANK|all",
        help="Which rank's values --return brings back (default 0); all: each name becomes a list by rank.",
    )
    @argument("--timeout", type=float, default=None, help="Stop every rank after this many seconds.")
    @argument("--config", default=None, metavar="PATH", help="nblaunch.yaml to use instead of the one found.")
    @argument("--port", type=int, default=None, help="Rendezvous port (a free one is used if it is taken).")
    @argument("--engine", default=None, help="local | ray (Ray Train on the cluster at ray_address).")
    @argument(
        "--ranks",
        default=None,
        metavar="RANKS|all",
        help="Live session only: run the cell on these ranks, e.g. 0 or 0,2 (default all).",
    )
    @cell_magic
    def distributed(self, line, cell):
        """Run this cell on N workers with torch.distributed set up; rank 0's output streams here.

        Inside the cell: the notebook's names plus ``rank``, ``local_rank``, ``world_size`` and
        ``device``. The last expression (on rank 0) is the cell's result; ``--return`` names are
        assigned in the notebook afterwards.

        Live ranks: after ``%distributed_start -n 4`` (same flags as here), every ``%%distributed``
        cell runs on the same ranks, which keep their state: names a cell assigns stay on the ranks
        for later cells; other names come from the notebook's current value (sent only when changed).
        Per cell, --return, --return-from, --output, --progress, --timeout and --ranks apply; a flag
        that contradicts the session (-n 8 on a 4-rank session) is an error. A failure or ■ stops the
        cell on every rank; ranks that come back keep their state, and a rank stuck in a collective
        means the session is restarted (said so in the error). ``%distributed_status``,
        ``%distributed_push NAMES``, ``%distributed_restart``, ``%distributed_stop``. Without a live
        session, each cell starts and ends its own workers.
        """
        args = parse_argstring(self.distributed, line)
        return_names = _names(args.return_names)
        return_from = _return_from(args.return_from)
        shell = self.shell
        session = live_session.current()
        if session is not None:
            results, ranks, return_from = run_live_cell(shell, session, args, cell, return_names, return_from)
            return _bring_back(shell, results, return_names, return_from, ranks)
        if args.ranks is not None:
            raise LaunchConfigError(
                "--ranks",
                args.ranks,
                None,
                message="--ranks needs a live session (%distributed_start): a one-shot cell runs on every rank.",
            )
        program = prepare_cell(cell, cell_label=cell_label(shell), line_offset=1, return_names=return_names)

        def bind(plan):
            if isinstance(return_from, int) and return_from >= plan.num_processes:
                raise LaunchConfigError(
                    "--return-from",
                    return_from,
                    f"a rank below the number of processes ({plan.num_processes}) or 'all'",
                )
            # fork: the workers inherit the notebook's namespace itself; spawn: ship what the cell uses
            program.namespace = shell.user_ns if plan.start_method == "fork" else ship_namespace(program, shell.user_ns)
            return program

        arguments = flag_arguments(args, engine=args.engine, metrics=args.metrics)
        remember_cell(CellRecord(cell, cell_label(shell), arguments, args.config))
        req = LaunchRequest(fn=program, arguments=arguments, config=args.config, bind=bind, return_all=return_from != 0)
        outcome = launch(req)
        results = outcome.values if req.return_all else [outcome.value]
        return _bring_back(shell, results, return_names, return_from, tuple(range(len(results))))

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


def _bring_back(shell, results: list, return_names, return_from, ranks: tuple[int, ...]):
    """Assign the --return names in the notebook; the cell's result (its first rank's last expression)."""
    first = ranks[0]
    chosen = results[first] if return_from == "all" else results[return_from]
    missing = chosen["missing"]
    if missing:
        rank = first if return_from == "all" else return_from
        raise LaunchConfigError(
            "--return",
            ",".join(missing),
            None,
            message=f"--return: rank {rank} did not define {', '.join(repr(m) for m in missing)}. Names that "
            f"exist after the cell: {', '.join(chosen['available']) or '(none)'}. The other names were "
            "not assigned either.",
        )
    if return_from == "all":
        for name in return_names:
            shell.user_ns[name] = [results[r]["returned"][name] for r in ranks]
    else:
        shell.user_ns.update(chosen["returned"])
    return results[first]["last"]


# A misspelt or shortened flag is an error, never silently taken for another flag.
DistributedMagics.distributed.parser.allow_abbrev = False
DistributedMagics.distributed_export.parser.allow_abbrev = False


def register(ipython) -> None:
    from .debug_magic import install as install_debug
    from .live_magics import register as register_live

    ipython.register_magics(DistributedMagics)
    register_live(ipython)
    install_debug(ipython)
