"""The live-session magics: ``%distributed_start`` (the flags of ``%%distributed``, declared once in
``magic_flags``), ``_stop``, ``_restart``, ``_status``, ``_push``. They parse and delegate to
``live.session.LiveSession``; a ``%%distributed`` cell reaches the session through ``cell_targets``.

Example (in a notebook)::

    %distributed_start -n 2
    %%distributed
    model = Net()          # stays on every rank
    %distributed_stop
"""

from __future__ import annotations

import time

from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import magic_arguments, parse_argstring

from .. import interrupts
from ..errors import CellInterrupted, LaunchConfigError
from ..live import registry as live
from .magic_flags import launch_flags, settings


def _require():
    s = live.current()
    if s is None:
        raise LaunchConfigError(
            None, None, None, message="no live session in this kernel: start one with %distributed_start -n 2."
        )
    return s


# what deferred() raises when ■ came once the session was up: the start is undone (_stop_what_came_up)
_CAME_UP = "the live session came up as ■ was pressed"


def _start_session(args):
    from ..live.session import LiveSession  # the session machinery, loaded when a session starts

    return LiveSession.start(settings(args), config=args.config)


def _stop_what_came_up() -> None:
    """■ was pressed while the session started and the ranks came up before it took effect: stop them again
    (further presses cannot cut that short), so that a ■ during a start always leaves no session."""
    with interrupts.deferred(interrupts.SESSION_NOT_STARTED, interrupts.SESSION_NOT_STARTED):
        s = live.current()
        if s is not None:
            s.stop()
    raise CellInterrupted(interrupts.SESSION_NOT_STARTED) from None


@magics_class
class LiveMagics(Magics):
    @magic_arguments()
    @launch_flags
    @line_magic
    def distributed_start(self, line):
        """Start live ranks that stay up across cells; returns when every rank is ready.

        While the session is live, every ``%%distributed`` cell runs on these ranks, which keep
        their names from cell to cell. ``%distributed_status``, ``%distributed_push NAMES``,
        ``%distributed_restart`` and ``%distributed_stop`` manage it.
        """
        t0 = time.monotonic()
        try:
            with interrupts.deferred(interrupts.SESSION_NOT_STARTED, _CAME_UP):  # the line below included
                s = _start_session(parse_argstring(self.distributed_start, line))
                print(f"nblaunch: live session up in {time.monotonic() - t0:.2f}s: {s.describe()}")
        except CellInterrupted as e:
            if e.args[:1] != (_CAME_UP,):
                raise
            _stop_what_came_up()  # ■ as the ranks came up still means "do not start"

    @line_magic
    @interrupts.deferring(interrupts.SESSION_STOPPED, interrupts.SESSION_STOPPED)
    def distributed_stop(self, line):
        """Stop the live session: every rank process ends, the port and every fd are freed."""
        s = live.current()
        if s is None:
            print("nblaunch: no live session to stop.")
            return
        s.stop()
        print("nblaunch: live session stopped; nothing is left running.")

    @line_magic
    @interrupts.deferring(interrupts.SESSION_NOT_RESTARTED)
    def distributed_restart(self, line):
        """New rank processes with the same flags; every name the cells made is gone."""
        s = _require()
        s.restart()
        print(f"nblaunch: the live session was restarted: its state is gone. {s.describe()}")

    @line_magic
    @interrupts.deferring(interrupts.REQUEST_NOT_SENT, interrupts.PUSHED)
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
            where = f" on node {r['node']} (local rank {r['local_rank']})" if r.get("node") else ""  # (a Ray world)
            lines.append(f"  rank {r['rank']}: pid {r['pid']}{where}, {r['state']}, {r['cells']} cells, RSS {rss}")
        print("\n".join(lines))
        return None


# A misspelt or shortened flag is an error, never silently taken for another flag.
LiveMagics.distributed_start.parser.allow_abbrev = False


def register(ipython) -> None:
    ipython.register_magics(LiveMagics)
