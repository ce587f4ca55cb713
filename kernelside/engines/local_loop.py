"""The kernel loop of a local launch: every rank's pipes (each rank's own ordered reader,
``engines.rank_reader``) and exit notifications, multiplexed in the calling thread (the kernel's
main thread, so Ctrl-C lands here).

It only observes: bytes go to the recorder as output, events as events, process exits as exits.
The recorder decides what they mean and, at the first failure, asks the engine to stop (SIGTERM
to every rank); ``launch.runner.run_engine`` decides how long to keep polling (the deadline, the
grace), and the engine's ``close()`` does the rest.

A live session's ranks outlive one run: their selector and ordered readers (``RankMux``, the
multiplexer of every rank's pipes) are made once per set of processes and lent to each request's loop,
which registers only what is its own (the notebook bridge, the interrupt fd, a tracker's Stop) and takes
it off again at its end. A cell then costs no selector, no registration and no reader per rank.

Example::

    >>> loop = EventLoop(group, recorder)              # doctest: +SKIP
    >>> while not loop.poll(0.1): pass
    >>> loop.finish()
    >>> mux = RankMux(group)                        # a live session's, once   # doctest: +SKIP
    >>> EventLoop(group, recorder, mux=mux)         # each request's            # doctest: +SKIP
"""

from __future__ import annotations

import selectors

from .. import interrupts
from ..channel import EventReader
from ..run_contract import stopped_message
from .local_bridge import EVENT_KINDS, NotebookBridge
from .rank_reader import RankReader


class RankMux:
    """Every rank's pipes and exit notification in one selector, with each rank's ordered reader: as long-lived
    as the processes (a one-shot launch's run, or a live session's world)."""

    def __init__(self, group, framing: list[EventReader] | None = None):
        """``framing``: the ranks' event readers (a live rank's token and partial frames), kept with the pipes."""
        framing = framing if framing is not None else [EventReader() for _ in group.workers]
        self.polling = any(w.pidfd is None for w in group.workers)
        self.sel = selectors.DefaultSelector()
        self.readers = {w.rank: RankReader(w, self.sel, framing[w.rank]) for w in group.workers}
        for w in group.workers:
            if w.pidfd is not None:
                self.sel.register(w.pidfd, selectors.EVENT_READ, (w, "exit"))
        self.own = set(self.sel.get_map())  # the fds that stay from run to run; a run's own are taken off at its end
        self.closed = False

    def forget(self, w) -> None:
        """A lost rank's fds off the selector, before they are closed (a Ray world replaces that rank)."""
        reader = self.readers.pop(w.rank, None)
        fds = list(reader.fds.values()) if reader is not None else []
        for fd in fds + ([w.pidfd] if w.pidfd is not None else []):
            if fd in self.sel.get_map():
                self.sel.unregister(fd)
        self.own = set(self.sel.get_map())

    def add(self, w) -> None:
        """A new rank's pipes and exit notification (the replacement of a lost one), with a fresh reader."""
        self.readers[w.rank] = RankReader(w, self.sel, EventReader())
        if w.pidfd is not None:
            self.sel.register(w.pidfd, selectors.EVENT_READ, (w, "exit"))
        self.own = set(self.sel.get_map())

    def watch(self, fd: int, data, keep: bool) -> None:
        """``fd`` on the selector; ``keep``: from run to run (an fd as long-lived as this process, registered once)."""
        if fd in self.own:
            return
        self.sel.register(fd, selectors.EVENT_READ, data)
        if keep:
            self.own.add(fd)

    def end_run(self) -> None:
        """Take off what a run registered (its bridge, the interrupt fd, a tracker's Stop): the next adds its own."""
        for fd in [fd for fd in self.sel.get_map() if fd not in self.own]:
            self.sel.unregister(fd)

    def close(self) -> None:
        """The processes are gone (or being replaced): the selector goes. Safe twice."""
        if not self.closed:
            self.closed = True
            self.sel.close()


class EventLoop:
    """The kernel loop: pipes and exits of every rank, multiplexed in the calling thread."""

    def __init__(self, group, recorder, *, until=None, mux: RankMux | None = None):
        """``until()``: the run is over when it returns True though processes still run (a live
        session's cell: every rank is back to idle); ``mux``: the ranks' selector and readers, kept
        across runs when the processes are (made here, and closed at the end, when not given)."""
        self.group, self.rec = group, recorder
        self.until = until
        self.lent = mux is not None
        self.mux = mux if mux is not None else RankMux(group)
        self.mux.end_run()  # (what a run that never got to finish() left registered: this run registers its own)
        self.polling, self.sel, self.readers = self.mux.polling, self.mux.sel, self.mux.readers
        # rank 0's display() and the ranks' input() reach the notebook (the answers' pipe: from the first prompt)
        self.bridge = NotebookBridge(recorder, lambda fd: self.sel.register(fd, selectors.EVENT_READ, (None, "stdin")))
        pressed = interrupts.wake_fd()  # ■ wakes the loop at once; the runner acts on it after this poll
        if pressed is not None:
            self.mux.watch(pressed, (None, "interrupt"), keep=self.lent)  # (the gate's pipe is the process's)
        control = recorder.observers.control
        if control is not None:  # the Runs view's Stop and stacks, served from this loop
            control.attach(self.sel, lambda place: recorder.stop_requested(stopped_message(place)), self.stack_targets)
        self.finished = False

    def stack_targets(self) -> list[tuple[int, int, str | None]]:
        """The ranks a request for stacks goes to: (rank, pid, how it ended or None), from this loop's thread."""
        return [(w.rank, w.pid, w.status.describe() if w.status else None) for w in self.group.workers]

    def poll(self, wait_s: float) -> bool:
        """Handle what becomes ready within ``wait_s`` seconds; True once the run is over."""
        alive = [w for w in self.group.workers if w.status is None]
        if not alive or (self.until is not None and self.until()):
            return True
        for key, _ in self.sel.select(min(wait_s, 0.02) if self.polling else wait_s):
            if key.fd not in self.sel.get_map():
                continue  # drained and unregistered by an earlier key of this same batch
            who, kind = key.data
            if kind == "stdin":
                self.bridge.on_wake()
            elif kind == "interrupt":
                continue  # (the runner's check, right after this poll, drains it and acts)
            elif kind == "control":
                who.on_ready(key.fd)  # the run's control channel (launch/run_control.py)
            elif kind == "exit":
                self._on_exit(who)
            else:
                self._route(who.w, who.on_readable(kind))  # who: the rank's reader
        if self.polling:
            for w in alive:
                if w.status is None and self.group.poll(w) is not None:
                    self._on_exit(w)
        self.bridge.tick()  # (the observers are ticked by the runner, once per turn of its loop)
        return False

    def finish(self) -> None:
        """The run is over: read what every rank wrote, close the bridge and (its own) the selector (safe twice)."""
        if self.finished:
            return
        self.finished = True
        try:
            self._drain_all()
        finally:
            self.bridge.close()
            if self.lent:
                self.mux.end_run()
            else:
                self.mux.close()

    def _route(self, w, items) -> None:
        """The items of one rank's reader, in their order: text to the recorder, events to it or the bridge."""
        for item in items:
            if item[0] == "output":
                self.rec.output(w.rank, item[1], item[2])
                continue
            _, kind, payload = item
            if kind == "error" and not self.rec.stopping:
                # A rank that already ended did so before this error was raised (a peer's crash is
                # what a collective reports as "connection reset"): let the recorder see that first.
                for other in self.group.workers:
                    if other is not w and other.status is None and self.group.poll(other) is not None:
                        self._on_exit(other)
            if kind in EVENT_KINDS:
                self.bridge.on_event(w, kind, payload)
            else:
                self.rec.event(w.rank, kind, payload)

    def _drain_all(self) -> None:
        # one select finds the pipes that hold anything: a live cell's end reads no empty pipe (3 per rank)
        ready = {key.fd for key, _ in self.sel.select(0)}
        for w in self.group.workers:
            self._route(w, self.readers[w.rank].drain(final=True, ready=ready))

    def _on_exit(self, w) -> None:
        self.group.poll(w)
        if w.pidfd is not None:
            try:
                self.sel.unregister(w.pidfd)
            except KeyError:
                pass
            self.mux.own.discard(w.pidfd)
        # everything a finished worker wrote is in its pipes already: read it before judging its exit
        self._route(w, self.readers[w.rank].drain(final=True))
        self.rec.exited(w.rank, w.status)
