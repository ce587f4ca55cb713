"""The engine contract: every member ``launch.runner.run_engine`` uses, and nothing more.

An engine starts ranks, reports what it observes to the run recorder, and stops them; it never
decides. The policy — the deadline (``timeout``), how long ranks get to stop, when to stop them,
what Ctrl-C does — is ``run_engine``'s alone, as torch elastic's agent owns it over its
``PContext`` and Ray Train's trainer over its ``Backend``: an engine writes no wait loop of its
own, it answers ``poll()`` for a bounded time and returns.

The life of one run, driven by ``run_engine``::

    port = engine.prepare()            # imports, rendezvous port; nothing started yet
    engine.observe(observers)          # what the engine watches besides the recorder (launch.observers)
    engine.start(recorder)             # ranks started, recorder.add_ranks(...)
    while not engine.poll(recorder, wait_s):   # observations → recorder, for at most wait_s
        observers.tick()               # run_engine: housekeeping once per turn; deadline → recorder.timeout();
        ...                            # grace over → leave
    engine.close(grace, recorder)      # SIGTERM → SIGKILL after grace, reap, free (safe twice)

and ``stop()``, which the recorder calls once at the first failure (or the timeout, Stop, Ctrl-C).
How a rank ended, as every engine reports it (``recorder.exited(rank, ExitStatus(...))``), is defined here too.

Example::

    >>> sorted(m for m in Engine.__abstractmethods__)
    ['close', 'poll', 'start', 'stop']
"""

from __future__ import annotations

import abc
import dataclasses
import signal


@dataclasses.dataclass
class ExitStatus:
    """How a worker ended: ``exitcode`` for a normal exit, ``signal`` for death by signal."""

    exitcode: int | None
    signal: int | None

    @property
    def ok(self) -> bool:
        return self.exitcode == 0

    def describe(self) -> str:
        if self.signal is not None:
            name = signal_name(self.signal)
            hint = {
                signal.SIGKILL: " — out of memory?",
                signal.SIGSEGV: " (segmentation fault)",
                signal.SIGBUS: " (bus error)",
                signal.SIGABRT: " (aborted)",
            }.get(self.signal, "")
            return f"killed by {name}{hint}"
        return f"exit code {self.exitcode}"


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def launch_settings(plan, render: str, return_all: bool) -> dict:
    """What every rank of a launch shares, as plain data any engine can send to its workers
    (``worker.lifecycle.RankSpec.build`` makes each rank's spec from it).

    Example::

        >>> launch_settings(plan, "text", False)["scope"]     # doctest: +SKIP
        'rank0'
    """
    return {
        "backend": plan.backend,
        "render": render,
        "scope": plan.progress,
        "metrics": plan.metrics,
        "return_all": return_all,
    }


class Engine(abc.ABC):
    """One run's ranks on some substrate (local processes, torch's elastic agent, Ray Train, a live world).

    Constructed as ``Engine(req, plan, log_dir, out, err, render=..., spawn_blob=...)``; nothing starts then.
    """

    #: the clock the ranks' event times are read on: "monotonic" (this machine) or "wall" (other machines too)
    clock = "monotonic"
    #: a line added to the error when a rank failed because a peer went away (a peer on another machine)
    peer_hint: str | None = None
    #: how long ranks get to end after ``stop()`` before ``close()`` kills what is left (None: no limit while they
    #: live, for ranks that come back to rest with state worth keeping; ■ again ends the wait)
    stop_grace_s: float | None = 2.0
    #: None: the kernel routes each rank's output (cell, log files) and keeps its tail; otherwise an
    #: object with ``tail(rank, n)`` over the logs the engine's own machinery writes
    log_tails = None
    #: how the ranks draw progress: "widgets" (events the kernel draws in the cell) or "text" (tqdm text
    #: bars in their output); settled by ``prepare()`` at the latest
    render = "text"
    #: True: the run's widgets appear only once there is something to show (a live cell: quick cells draw none)
    defer_display = False
    #: True: every rank's log file exists already (a live session's request: its start made them), so the
    #: output router does not make them again for this run
    rank_logs_made = False
    #: the ranks this run's code runs on (a live cell's ``--ranks``); None: every rank of the world
    ranks: tuple[int, ...] | None = None

    def prepare(self) -> int | None:
        """Before the report exists: what ranks need from the kernel first; returns the rendezvous port."""
        return None

    @abc.abstractmethod
    def start(self, recorder) -> None:
        """Start the ranks and tell the recorder which (``recorder.add_ranks``)."""

    @abc.abstractmethod
    def poll(self, recorder, wait_s: float) -> bool:
        """Feed the recorder what was observed within ``wait_s`` seconds; True once the run is over
        (every rank has ended, or is back at rest for an engine that keeps its ranks)."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Ask every rank still running to stop (the recorder calls it once); returns at once."""

    @abc.abstractmethod
    def close(self, grace: float, recorder) -> None:
        """Whatever is left is stopped (killed after ``grace`` seconds), reaped and freed; the last
        observations go to the recorder (None: nobody listens any more). Safe to call twice."""

    def observe(self, observers) -> None:
        """Register what the engine itself watches of the run (``launch.observers.RunObservers.watch``), before
        ``start()``: a live request watches its ranks come back to idle and say where they were. None by default."""
        return None

    def rank_processes(self) -> list[tuple[int, int, str | None]]:
        """Where the ranks are, for asking their stacks: this kernel's own rank processes as (rank, pid, how it
        ended or None). Empty for ranks that are not this kernel's children (Ray, torch's elastic launcher)."""
        return []

    def on_interrupt(self, again: bool) -> None:
        """■ was acted on (``again``: while the ranks were already being stopped, so the user wants no more
        waiting). The run's stop follows through ``stop()``; this is for engines that keep their ranks."""
        return None

    def interrupt_error(self, recorder) -> BaseException | None:
        """What Ctrl-C raises once the ranks have settled; None: the KeyboardInterrupt itself."""
        return None
