"""The events of ranks under torch's elastic launcher, across machines, through the rendezvous store.

Ranks under ``elastic_launch`` have no pipe to a kernel: they may run on another machine. What
every machine already reaches is the rendezvous store at ``main_process_ip:rdzv_port`` (a
TCPStore for the ``c10d`` and ``static`` backends), so each rank pushes its events (``ready``,
``done``, ``progress``, ``metrics``, ``left``) onto one queue there, and machine 0's kernel —
whose cell shows rank 0 — pops them into its run recorder: its bars and chart show every rank's.

- The store must outlive the last event: the kernel that can host it (the one on the endpoint's
  address) starts it before torch's agent does (torch shares a TCPStore server per port, so the
  agent uses this one) and keeps it until machine 0 has read the queue (``DRAINED_KEY``, or
  ``HOLD_S``).
- A rank's ``error`` stays on its machine (an error file in the run folder, read after the run):
  each machine's cell names the root cause it saw, with its own ranks' tracebacks.
- What cannot travel: rich output (``display()``), ``input()`` prompts — these need the kernel's
  ordered pipes and its stdin channel (``engines.local_bridge``); the rank's text is teed by torch.

Example::

    >>> events = RankEvents(error_dir, rank=3, endpoint=("10.0.0.1", 29500), run="job")   # in a rank  # doctest: +SKIP
    >>> events.send("progress", {...})
    >>> kernel = KernelEvents("10.0.0.1", 29500, "job", reader=True)   # machine 0's kernel  # doctest: +SKIP
    >>> kernel.drain(recorder)
"""

from __future__ import annotations

import datetime
import pickle
import sys
import threading

from .elastic_files import write_error

QUEUE_KEY = "nblaunch/{run}/events"
DRAINED_KEY = "nblaunch/{run}/drained"
CONNECT_S = 10.0  # a rank or machine 0's kernel gives up on the store after this long (events then stay off)
HOLD_S = 5.0  # a hosting kernel that is not machine 0 keeps the store this long at most for its reader


def _store(host: str, port: int, *, host_it: bool):
    from torch.distributed import TCPStore

    return TCPStore(
        host,
        port,
        is_master=host_it,
        multi_tenant=True,  # torch's agent, in this same process, shares the server instead of binding again
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=CONNECT_S),
    )


class RankEvents:
    """A rank's events: the error to a file in its machine's run folder, the rest onto the store's queue,
    the pickled result kept for the entry to return to torch."""

    def __init__(self, error_dir: str, rank: int, endpoint: tuple[str, int] | None, run: str):
        self.error_dir = error_dir
        self.rank = rank
        self.result: bytes | None = None
        self.key = QUEUE_KEY.format(run=run)
        self.lock = threading.Lock()  # progress bars may report from several threads
        self.store = None
        if endpoint is not None:
            try:
                self.store = _store(*endpoint, host_it=False)
            except Exception as e:  # noqa: BLE001 - the run goes on without bars in the cell
                print(f"nblaunch: rank {rank} cannot reach the rendezvous store for its events: {e}", file=sys.stderr)

    def send(self, kind, payload=None) -> None:
        if kind == "error":
            write_error(self.error_dir, self.rank, payload)  # (owner-only, inside the run folder, no link followed)
            return
        if self.store is None:
            return
        try:
            body = pickle.dumps((self.rank, kind, payload), protocol=pickle.HIGHEST_PROTOCOL)
            with self.lock:
                self.store.queue_push(self.key, body)
        except Exception:  # noqa: BLE001 - the store went away (the run is ending): the rest stays here
            self.store = None

    def send_result(self, body: bytes) -> None:
        self.result = body


class KernelEvents:
    """A kernel's end of the store: hosts it when this machine can (so it lives until read), and on
    machine 0 (``reader``) feeds the queued events to the recorder."""

    def __init__(self, host: str, port: int, run: str, *, reader: bool, may_host: bool):
        self.reader, self.hosting, self.store = reader, False, None
        self.queue, self.drained = QUEUE_KEY.format(run=run), DRAINED_KEY.format(run=run)
        if may_host:
            try:
                self.store, self.hosting = _store(host, port, host_it=True), True
            except Exception:  # noqa: BLE001 - another machine (or process) hosts it
                pass
        if self.store is None and reader:
            try:
                self.store = _store(host, port, host_it=False)
            except Exception as e:  # noqa: BLE001
                print(
                    f"nblaunch: the rendezvous store at {host}:{port} cannot be reached: {e}; "
                    "bars and metrics of the ranks will not show in this cell.",
                    file=sys.stderr,
                )

    @property
    def delivers(self) -> bool:
        """Whether the ranks' events reach this kernel's recorder."""
        return self.reader and self.store is not None

    def drain(self, recorder) -> None:
        """Every event queued so far, to the recorder (machine 0's kernel only)."""
        if not self.delivers:
            return
        try:
            for _ in range(self.store.queue_len(self.queue)):
                rank, kind, payload = pickle.loads(self.store.queue_pop(self.queue, block=False))
                recorder.event(rank, kind, payload)
        except Exception:  # noqa: BLE001 - the host went away with the run: what was read stands
            self.store = None

    def close(self, recorder) -> None:
        """The run is over on this machine: the last events read, then the store let go (a host that is
        not the reader first waits, ``HOLD_S`` at most, for the reader to have read them)."""
        try:
            if self.delivers and recorder is not None:
                self.drain(recorder)
                self.store.set(self.drained, b"1")
            elif self.hosting and not self.reader:
                self.store.wait([self.drained], datetime.timedelta(seconds=HOLD_S))
        except Exception:  # noqa: BLE001 - the reader never came (it failed early): nothing to wait for
            pass
        self.store = None
