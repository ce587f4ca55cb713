"""The kernel's end of what the ranks on other machines say of themselves: their ``resources`` connections,
read by one daemon thread that appends the figures to the run folder's ``resources.jsonl``.

A rank of a Ray world on another machine samples its own CPU, memory and GPU use (``worker.own_resources``)
about once a second and sends one JSON line on its ``resources`` connection. This thread reads every such
connection, keeps each rank's latest line, and about once a second appends them to the run folder as one batch
(one write), in the format ``run_contract.RESOURCES_FILE`` says: the Jupyter server takes each rank's latest
line from there when it samples the run, as it takes a local rank's figures from ``/proc``. Its ``wall`` is
this machine's clock when the line came, the clock the server compares it with. The file is bounded: past
``RESOURCES_MAX_BYTES`` it is replaced by one holding the last batch.

The thread owns the connections handed to it (``add``): it closes them at their end, at ``forget`` and at
``close``. It never touches the kernel loop or the ranks' other channels, so a cell pays nothing for it.

Example::

    >>> reports = RankReports(run_dir)                      # doctest: +SKIP
    >>> reports.add(rank=2, pid=4187, fd=fd); ...; reports.close()
"""

from __future__ import annotations

import json
import os
import selectors
import threading
import time

from ..debugger.undebugged import undebugged
from ..engines.local_group import close_quietly
from ..private_dir import open_in, replace_in, write_in
from ..run_contract import RESOURCES_EVERY_S, RESOURCES_FIGURES, RESOURCES_FILE, RESOURCES_MAX_BYTES

MAX_LINE = 4096  # a rank's line is a few dozen bytes: more without a newline is not a rank's
_TMP = ".resources.jsonl.tmp"


class RankReports:
    """The ``resources`` connections of the ranks on other machines; see the module docstring."""

    def __init__(self, run_dir: str, max_bytes: int = RESOURCES_MAX_BYTES, every: float = RESOURCES_EVERY_S):
        self.run_dir, self.max_bytes, self.every = run_dir, max_bytes, every
        self.written = 0
        self._lock = threading.Lock()
        self._asked: list[tuple] = []  # ("add", rank, pid, fd) and ("forget", rank), in order, for the thread
        self._latest: dict[int, dict] = {}  # rank -> its latest line, not written yet
        self._rss: dict[int, int] = {}  # rank -> its latest RSS (``%distributed_status``), read by the main thread
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._closed = False
        self._thread = undebugged(threading.Thread(target=self._run, name="nblaunch-rank-reports", daemon=True))
        self._thread.start()

    def add(self, rank: int, pid: int, fd: int) -> None:
        """Read rank ``rank``'s (process ``pid``) ``resources`` connection ``fd`` from now on; the thread owns it."""
        with self._lock:
            self._asked.append(("add", rank, pid, fd))
        self._wake()

    def forget(self, rank: int) -> None:
        """Rank ``rank`` was lost: its connection is closed (a replacement comes with its own)."""
        with self._lock:
            self._asked.append(("forget", rank))
        self._wake()

    def rss(self, rank: int) -> int | None:
        """Rank ``rank``'s memory (RSS bytes) as it last said, or None."""
        return self._rss.get(rank)

    def close(self) -> None:
        """The world ends: the thread stops and every connection it held is closed."""
        if self._closed:
            return
        self._closed = True
        self._wake()
        self._thread.join(5)
        close_quietly(self._wake_r, self._wake_w)

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    # -- the thread -----------------------------------------------------------------------
    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self._wake_r, selectors.EVENT_READ, None)
        conns: dict[int, list] = {}  # fd -> [rank, pid, partial line]
        next_write = time.monotonic() + self.every
        try:
            while not self._closed:
                for key, _ in sel.select(max(0.0, next_write - time.monotonic())):
                    if key.data is None:
                        self._take_requests(sel, conns)
                    else:
                        self._read(sel, conns, key.fd)
                if time.monotonic() >= next_write:
                    next_write = time.monotonic() + self.every
                    self._flush()
        finally:
            for fd in list(conns):
                sel.unregister(fd)
                close_quietly(fd)
            sel.close()

    def _take_requests(self, sel, conns: dict) -> None:
        try:
            os.read(self._wake_r, 4096)
        except OSError:
            pass
        with self._lock:
            asked, self._asked = self._asked, []
        for what, rank, *more in asked:
            if what == "forget":
                for fd in [fd for fd, entry in conns.items() if entry[0] == rank]:
                    self._drop(sel, conns, fd)
            else:
                pid, fd = more
                os.set_blocking(fd, False)
                conns[fd] = [rank, pid, b""]
                sel.register(fd, selectors.EVENT_READ, "rank")

    def _drop(self, sel, conns: dict, fd: int) -> None:
        rank = conns.pop(fd)[0]
        self._latest.pop(rank, None)
        self._rss.pop(rank, None)
        sel.unregister(fd)
        close_quietly(fd)

    def _read(self, sel, conns: dict, fd: int) -> None:
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:  # the rank's process ended (its node gone, killed, the world's end)
            self._drop(sel, conns, fd)
            return
        entry = conns[fd]
        lines = (entry[2] + data).split(b"\n")
        entry[2] = lines.pop()[-MAX_LINE:]
        now = time.time()
        for line in lines[-1:]:  # only the latest counts
            try:
                said = json.loads(line)
            except (ValueError, UnicodeDecodeError, RecursionError):
                continue
            if isinstance(said, dict):
                figures = {k: said[k] for k in RESOURCES_FIGURES if isinstance(said.get(k), (int, float))}
                rank, pid = entry[0], entry[1]
                self._latest[rank] = {"kind": "resources", "rank": rank, "pid": pid, "wall": now, **figures}
                if isinstance(figures.get("rss_bytes"), int):
                    self._rss[rank] = figures["rss_bytes"]

    def _flush(self) -> None:
        if not self._latest:
            return
        batch, self._latest = self._latest, {}
        data = b"".join(json.dumps(line).encode() + b"\n" for _, line in sorted(batch.items()))
        try:
            if self.written + len(data) > self.max_bytes:
                write_in(self.run_dir, _TMP, data)  # a new file whole, then in its place: readers see one or the other
                replace_in(self.run_dir, _TMP, RESOURCES_FILE)
                self.written = len(data)
                return
            fd = open_in(self.run_dir, RESOURCES_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        except OSError:
            return  # the run folder is gone, or the disk is full: this batch is lost, the session goes on
        try:
            os.write(fd, data)
            self.written += len(data)
        except OSError:
            pass
        finally:
            os.close(fd)
