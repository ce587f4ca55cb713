"""The live-session magics: ``%distributed_start``, ``_stop``, ``_restart``, ``_status``, ``_push``, and
what ``%%distributed`` does while a session is live (``run_live_cell``). They parse and delegate to
``live.session.LiveSession``, as the one-shot magic delegates to ``launch()``.

Example (in a notebook)::

    %distributed_start -n 2
    %%distributed
    model = Net()          # stays on every rank
    %distributed_stop
"""

from __future__ import annotations

import time

from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from ..config import resolve_config
from ..config.launch_rules import arguments as config_arguments
from ..errors import LaunchConfigError
from ..live import registry as live
from .cell import prepare_cell
from .cell_label import cell_label

# flags fixed for the whole session; a cell that gives another value is refused
SESSION_FLAGS = {
    "num_processes": "-n",
    "backend": "--backend",
    "start_method": "--start-method",
    "mixed_precision": "--mixed-precision",
    "gpu_ids": "--gpu-ids",
    "main_process_port": "--port",
    "engine": "--engine",
}


def parse_ranks(spec: str | None, world: int) -> tuple[int, ...] | None:
    """``--ranks 0`` / ``0,2`` / ``all`` → the ranks a cell runs on (None: all)."""
    if spec is None or spec == "all":
        return None
    try:
        ranks = tuple(sorted({int(p) for p in spec.split(",") if p.strip()}))
    except ValueError:
        ranks = ()
    if not ranks or any(not 0 <= r < world for r in ranks):
        raise LaunchConfigError(
            "--ranks", spec, f"rank numbers of this {world}-rank live session (0..{world - 1}) or 'all'"
        )
    return ranks


def check_cell_flags(session, args) -> None:
    """A per-cell flag that contradicts the session is an error that names both values; nothing runs."""
    given = config_arguments(
        "flag",
        num_processes=args.num_processes,
        backend=args.backend,
        start_method=args.start_method,
        mixed_precision=args.mixed_precision,
        gpu_ids=args.gpu_ids,
        port=args.port,
        engine=args.engine,
    )
    if args.config is not None and args.config != session.config:
        raise LaunchConfigError(
            "--config",
            args.config,
            None,
            message=f"--config {args.config} contradicts the live session, started with config {session.config}. "
            "A live session's configuration is fixed: %distributed_stop, then %distributed_start with it. Nothing ran.",
        )
    if not given:
        return
    cell_cfg = resolve_config({**session.arguments, **given}, config=session.config)
    plan = session.plan
    actual = {
        "num_processes": plan.num_processes,
        "backend": plan.backend,
        "start_method": plan.start_method,
    }
    for key, value in given.items():
        have = actual.get(key, session.cfg.values.get(key))
        want = cell_cfg.values.get(key, value)
        if key in ("backend", "start_method") and want == "auto":
            continue
        if want != have:
            raise LaunchConfigError(
                SESSION_FLAGS.get(key, key),
                value,
                None,
                message=f"{SESSION_FLAGS.get(key, key)} {value} contradicts the live session ({key} is {have!r} there: "
                f"{session.describe()}). Per cell, only --return, --return-from, --output, --progress, --timeout and "
                "--ranks can change. Restart the session with other flags (%distributed_stop, %distributed_start) "
                "to change it. Nothing ran.",
            )


def run_live_cell(shell, session, args, cell: str, return_names, return_from):
    """``%%distributed`` while a session is live: the cell runs on its ranks; (results by rank, the ranks, the
    rank whose --return values come back)."""
    check_cell_flags(session, args)
    ranks = parse_ranks(args.ranks, session.plan.num_processes)
    chosen = ranks if ranks is not None else tuple(range(session.plan.num_processes))
    if return_from == 0 and 0 not in chosen:
        return_from = chosen[0]  # the default follows the cell to the ranks it runs on
    if isinstance(return_from, int) and return_from not in chosen:
        raise LaunchConfigError("--return-from", return_from, f"one of the ranks the cell runs on: {chosen}")
    program = prepare_cell(cell, cell_label=cell_label(shell), line_offset=1, return_names=return_names)
    senders = set(chosen) if return_from == "all" else {chosen[0], return_from}
    outcome = session.run_cell(
        program,
        return_from=tuple(sorted(senders)),
        ranks=ranks,
        output=args.output,
        progress=args.progress,
        timeout=args.timeout,
    )
    return outcome.values, chosen, return_from


def flag_arguments(args, **extra) -> dict:
    """The launch settings a %%distributed / %distributed_start line gave, under their schema names."""
    return config_arguments(
        "flag",
        **extra,
        num_processes=args.num_processes,
        backend=args.backend,
        start_method=args.start_method,
        mixed_precision=args.mixed_precision,
        gpu_ids=args.gpu_ids,
        output=args.output,
        progress=args.progress,
        timeout=args.timeout,
        port=args.port,
    )


def _require():
    s = live.current()
    if s is None:
        raise LaunchConfigError(
            None, None, None, message="no live session in this kernel: start one with %distributed_start -n 2."
        )
    return s


@magics_class
class LiveMagics(Magics):
    @magic_arguments()
    @argument("-n", "--num-processes", type=int, default=None, help="Number of ranks (as for %%distributed).")
    @argument("--backend", default=None, help="auto | nccl | gloo.")
    @argument("--start-method", default=None, help="auto | fork | forkserver | spawn.")
    @argument("--mixed-precision", default=None, help="no | fp16 | bf16 | fp8.")
    @argument("--gpu-ids", default=None, help="GPUs to use: all, or indices such as 0,1.")
    @argument("--output", default=None, help="Whose output shows in the cells: rank0 | all | none.")
    @argument("--progress", default=None, help="Whose progress bars show: rank0 | all.")
    @argument("--timeout", type=float, default=None, help="Default per-cell timeout in seconds.")
    @argument("--config", default=None, metavar="PATH", help="nblaunch.yaml to use instead of the one found.")
    @argument("--port", type=int, default=None, help="Rendezvous port (a free one is used if it is taken).")
    @line_magic
    def distributed_start(self, line):
        """Start live ranks that stay up across cells; returns when every rank is ready.

        While the session is live, every ``%%distributed`` cell runs on these ranks, which keep
        their names from cell to cell. ``%distributed_status``, ``%distributed_push NAMES``,
        ``%distributed_restart`` and ``%distributed_stop`` manage it.
        """
        args = parse_argstring(self.distributed_start, line)
        t0 = time.monotonic()
        from ..live.session import LiveSession  # the session machinery, loaded when a session starts

        s = LiveSession.start(flag_arguments(args), config=args.config)
        print(f"nblaunch: live session up in {time.monotonic() - t0:.2f}s: {s.describe()}")

    @line_magic
    def distributed_stop(self, line):
        """Stop the live session: every rank process ends, the port and every fd are freed."""
        s = live.current()
        if s is None:
            print("nblaunch: no live session to stop.")
            return
        s.stop()
        print("nblaunch: live session stopped; nothing is left running.")

    @line_magic
    def distributed_restart(self, line):
        """New rank processes with the same flags; every name the cells made is gone."""
        s = _require()
        s.restart()
        print(f"nblaunch: the live session was restarted: its state is gone. {s.describe()}")

    @line_magic
    def distributed_push(self, line):
        """Send these notebook values to every rank now: ``%distributed_push cfg,weights``."""
        names = [n for n in line.replace(",", " ").split() if n]
        if not names:
            raise LaunchConfigError("%distributed_push", line, "names of notebook variables, e.g. cfg,weights")
        sent = _require().push(names)
        print(f"nblaunch: sent {', '.join(sent)} to every rank.")

    @line_magic
    def distributed_status(self, line):
        """The live session: per rank pid, idle/busy, cells run, memory; the flags and uptime."""
        s = live.current()
        if s is None:
            print("nblaunch: no live session (start one with %distributed_start).")
            return None
        lines = [f"live session: {s.describe()}; restarts {s.restarts}; logs {s.log_dir}"]
        for r in s.status():
            rss = f"{r['rss'] / 2**20:.0f} MiB" if r["rss"] else "?"
            lines.append(f"  rank {r['rank']}: pid {r['pid']}, {r['state']}, {r['cells']} cells, RSS {rss}")
        print("\n".join(lines))
        return None


def register(ipython) -> None:
    ipython.register_magics(LiveMagics)
    LiveMagics.distributed_start.parser.allow_abbrev = False
