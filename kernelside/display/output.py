"""Route the bytes workers write on fds 1/2: whole lines to the cell, everything to log files.

Lines are assembled per (rank, stream) before they are shown, so a line is never split or
merged with another rank's line. ``\\r``-terminated segments (text progress bars) count
as lines too. With ``output="rank0"`` a partial line that sits unfinished for a moment
(a prompt, ``print(..., end="")``) is shown anyway, since nothing else can interleave with
it; with ``output="all"`` it waits for its newline so ``[rank N]`` prefixes stay clean.

Every byte also goes, unmodified, to ``<log_dir>/rank<N>.log`` (made owner-only inside the run
folder by its descriptor, ``private_dir.open_in``), and the last lines of each rank are kept for
error messages.

What the cell shows is budgeted: a burst of ``SHOW_BURST_BYTES``, then ``SHOW_RATE_BYTES``
per second. Lines over the budget are held back (counted, the last ones kept) until half the
burst is available again; then one note says how many lines were left out and which log has
them, and output goes on. At the end of the run the count and the last held-back lines are shown.

Example::

    >>> r = RankOutputRouter(2, "rank0", log_dir, sys.stdout, sys.stderr)   # doctest: +SKIP
    >>> r.feed(0, "stdout", b"hello\\nwor"); r.feed(0, "stdout", b"ld\\n")
"""

from __future__ import annotations

import collections
import errno
import os
import time

from ..private_dir import open_in
from ..run_contract import LOG_TIMES_EVERY_S, log_times_record, rank_log_name, rank_log_times_name

TAIL_LINES = 40
# What the cell shows is budgeted (token bucket) below Jupyter server's default IOPub limit of
# 1 MB/s over 3 s, so a flood of prints never stalls the notebook or makes the server drop output.
SHOW_RATE_BYTES = 256 * 1024
SHOW_BURST_BYTES = 1024 * 1024
SHOW_RESUME_BYTES = SHOW_BURST_BYTES // 2  # once over budget, the cell waits until this much is back
HELD_TAIL_LINES = 20  # of the lines held back, the last ones are shown when the run ends
HELD_TAIL_BYTES = 64 * 1024  # ... at most this much of them (the end of a very long line)
MAX_MESSAGE_BYTES = 64 * 1024  # flush the cell's stream this often: no single output message is larger
PARTIAL_FLUSH_S = 0.25
MAX_PENDING = 1 << 16


def _prefix(template: str | None, mode: str, rank: int) -> str:
    if template:
        return (
            template.replace("${rank}", str(rank))
            .replace("${local_rank}", str(rank))
            .replace("${role_name}", "default")
        )
    return f"[rank {rank}] " if mode == "all" else ""


class _LineBuffer:
    __slots__ = ("data", "since")

    def __init__(self):
        self.data = b""
        self.since = 0.0


class RankOutputRouter:
    def __init__(
        self,
        world_size: int,
        mode: str,
        log_dir: str,
        stdout,
        stderr,
        prefix_template: str | None = None,
        tabs=None,
        make_logs: bool = True,
    ):
        """``make_logs``: make every rank's (empty) log file now; False when they exist already (a live request)."""
        self.mode = mode
        self.tabs = tabs  # output="all" in a notebook: each rank's lines go to its tab (rank_tabs.py), not the stream
        self.prefixes = {r: _prefix(prefix_template, mode, r) for r in range(world_size)}
        self.log_dir = log_dir
        self.sinks = {"stdout": stdout, "stderr": stderr}
        self.buffers = {(r, s): _LineBuffer() for r in range(world_size) for s in ("stdout", "stderr")}
        self.tails = {r: collections.deque(maxlen=TAIL_LINES) for r in range(world_size)}
        self.logs = {}
        self.log_paths = {}
        self.budget, self.budget_t = float(SHOW_BURST_BYTES), time.monotonic()
        self.held_back, self.held_rank = 0, 0
        self.held_tail: collections.deque = collections.deque(maxlen=HELD_TAIL_LINES)
        self.unflushed = 0
        self.written: set[str] = set()  # the streams this router wrote to: finish() flushes only those
        self.times = _LogTimes(log_dir)  # when each rank's bytes arrived (rank<N>.times, for the Runs view)
        self.log_sizes: dict[int, int] = {}
        self.log_failed: dict[int, OSError] = {}  # ranks whose log could not be written (a full disk): said once
        for r in range(world_size):
            self.log_paths[r] = os.path.join(log_dir, rank_log_name(r))  # the run folder's contract (the server's)
            # every rank has its log from the start; it is opened at its first bytes
            if not make_logs:
                continue
            try:
                os.close(open_in(log_dir, rank_log_name(r), os.O_WRONLY | os.O_CREAT | os.O_APPEND))
            except OSError:
                pass  # (no room for even an empty file: the rank's first bytes say so in the cell)

    def shown(self, rank: int) -> bool:
        return self.mode == "all" or (self.mode == "rank0" and rank == 0)

    def feed(self, rank: int, stream: str, data: bytes) -> None:
        if rank not in self.log_failed:
            try:
                log = self.logs.get(rank)
                if log is None:  # (a live cell that prints nothing opens no file)
                    log = self.logs[rank] = _append(self.log_dir, rank_log_name(rank))
                    self.log_sizes[rank] = os.fstat(log.fileno()).st_size
                log.write(data)
                self.log_sizes[rank] += len(data)
                self.times.arrived(rank, self.log_sizes[rank])
            except OSError as e:  # a full disk costs the log what follows, never the output or the run
                if not self.log_failed:  # said once per run
                    self._write("stderr", self._log_failed_note(rank, e))
                self.log_failed[rank] = e
        buf = self.buffers[(rank, stream)]
        if not buf.data:
            buf.since = time.monotonic()
        chunk = buf.data + data
        cut = max(chunk.rfind(b"\n"), chunk.rfind(b"\r"))
        if cut < 0:
            buf.data = chunk
            if len(chunk) > MAX_PENDING:  # a line this long is shown in pieces rather than held forever
                self._emit(rank, stream, chunk)
                buf.data = b""
            return
        whole, buf.data = chunk[: cut + 1], chunk[cut + 1 :]
        buf.since = time.monotonic()
        self._emit(rank, stream, whole)

    def flush_stale(self, now: float | None = None) -> None:
        """Show partial lines that have waited long enough (only where they cannot interleave)."""
        self.times.flush()
        if self.tabs is not None:
            self.tabs.tick()
        if self.mode != "rank0":
            return
        now = time.monotonic() if now is None else now
        for stream in ("stdout", "stderr"):
            buf = self.buffers[(0, stream)]
            if buf.data and now - buf.since >= PARTIAL_FLUSH_S:
                data, buf.data = buf.data, b""
                self._emit(0, stream, data)

    def finish(self) -> None:
        """Emit whatever is left (the run is over) and close the log files."""
        for (rank, stream), buf in self.buffers.items():
            if buf.data:
                data, buf.data = buf.data, b""
                self._emit(rank, stream, data if data.endswith((b"\n", b"\r")) else data + b"\n")
        if self.held_back:  # the head was shown; now the count and the tail
            tail = "".join(self.held_tail)[-HELD_TAIL_BYTES:]
            self._write("stdout", self._held_back_note().replace("]\n", f"; the last {len(self.held_tail)}:]\n"))
            self._write("stdout", tail if tail.endswith("\n") else tail + "\n")
            self.held_back = 0
        if self.tabs is not None:
            self.tabs.tick(force=True)
        for fh in self.logs.values():
            fh.close()
        self.times.close()
        for stream in self.written:  # (a flush of the kernel's stream is a round trip to its IOPub thread)
            try:
                self.sinks[stream].flush()
            except Exception:
                pass

    def tail(self, rank: int, n: int = 20) -> str:
        return "".join(list(self.tails[rank])[-n:])

    def _emit(self, rank: int, stream: str, data: bytes) -> None:
        text = data.decode("utf-8", errors="replace")
        tail = self.tails[rank]
        for line in text.splitlines(keepends=True):
            if line.strip("\r\n"):
                tail.append(line if line.endswith("\n") else line.rstrip("\r") + "\n")
        if not self.shown(rank):
            return
        if self.tabs is not None:
            self.tabs.write(rank, stream, text)
            return
        prefix = self.prefixes[rank]
        if prefix:
            text = "".join(prefix + ln for ln in text.splitlines(keepends=True))
        self._show(rank, stream, text)

    def spend(self, nbytes: int) -> bool:
        """Take ``nbytes`` of the cell's budget for rich output (rank 0's display()); False: over it, left out."""
        self._refill()
        if self.held_back or nbytes > self.budget:
            return False
        self.budget -= nbytes
        return True

    def _refill(self) -> None:
        now = time.monotonic()
        self.budget = min(SHOW_BURST_BYTES, self.budget + (now - self.budget_t) * SHOW_RATE_BYTES)
        self.budget_t = now

    def _show(self, rank: int, stream: str, text: str) -> None:
        """Write to the cell within the output budget; what is over it is counted, and its tail kept."""
        self._refill()
        if self.held_back:
            if self.budget < SHOW_RESUME_BYTES:  # keep holding until a good share of the budget is back
                self._hold(rank, text.splitlines(keepends=True))
                return
            note = self._held_back_note()
            self.budget -= len(note)
            self._write(stream, note)
            self.held_back = 0
            self.held_tail.clear()
        shown = text
        if len(text) > self.budget:  # show the whole lines that fit, hold back the rest
            lines, used, fit = text.splitlines(keepends=True), 0, 0
            while fit < len(lines) and used + len(lines[fit]) <= self.budget:
                used += len(lines[fit])
                fit += 1
            shown = "".join(lines[:fit])
            self._hold(rank, lines[fit:])
        if shown:
            self.budget -= len(shown)
            self._write(stream, shown)

    def _hold(self, rank: int, lines: list[str]) -> None:
        self.held_back += len(lines)
        self.held_tail.extend(lines)
        self.held_rank = rank

    def _log_failed_note(self, rank: int, e: OSError) -> str:
        why = e.strerror or str(e)
        if e.errno == errno.ENOSPC:
            why = f"the disk holding {self.log_dir} is full"
        elif e.errno == errno.EDQUOT:
            why = f"your disk quota for {self.log_dir} is used up"
        return (
            f"[nblaunch: rank {rank}'s log {self.log_paths[rank]} could not be written ({why}): the ranks' output "
            "still shows here as ever, but their logs (and the Runs view) miss what follows; free space or set "
            "log_dir to another disk]\n"
        )

    def _held_back_note(self) -> str:
        return (
            f"[nblaunch: {self.held_back} line(s) not shown here: output above {SHOW_RATE_BYTES // 1024} KiB/s "
            f"is held back to keep the notebook responsive; every line is in {self.log_paths[self.held_rank]}]\n"
        )

    def _write(self, stream: str, text: str) -> None:
        """Write, flushing at line boundaries so that no single output message exceeds MAX_MESSAGE_BYTES."""
        sink = self.sinks[stream]
        self.written.add(stream)
        if self.unflushed + _size(text) <= MAX_MESSAGE_BYTES:
            sink.write(text)
            self.unflushed += _size(text)
            return
        for whole in text.splitlines(keepends=True):
            # a line longer than a message goes in pieces of one message each (UTF-8: 4 bytes a character at most)
            piece = MAX_MESSAGE_BYTES if whole.isascii() else MAX_MESSAGE_BYTES // 4
            for at in range(0, len(whole), piece):
                line = whole[at : at + piece]
                if self.unflushed and self.unflushed + _size(line) > MAX_MESSAGE_BYTES:
                    sink.flush()
                    self.unflushed = 0
                sink.write(line)
                self.unflushed += _size(line)


def _size(text: str) -> int:
    """``text``'s size in an output message (UTF-8)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "replace"))


def _append(folder: str, name: str):
    """The file ``name`` of the run folder, opened (made owner-only) for appending, unbuffered."""
    return os.fdopen(open_in(folder, name, os.O_WRONLY | os.O_CREAT | os.O_APPEND), "ab", buffering=0)


class _LogTimes:
    """Writes ``rank<N>.times`` (``run_contract``): a record when a rank's log grows, at most one per
    ``LOG_TIMES_EVERY_S``; within that, the burst's last bytes wait for ``flush()`` (every loop turn)."""

    def __init__(self, log_dir: str):
        self.log_dir = log_dir
        self.files: dict[int, object] = {}
        self.last: dict[int, float] = {}  # monotonic time of the rank's last record
        self.pending: dict[int, tuple[int, float]] = {}  # rank -> (log size, wall time) not written yet

    def arrived(self, rank: int, end: int) -> None:
        self.pending[rank] = (end, time.time())
        if time.monotonic() - self.last.get(rank, float("-inf")) >= LOG_TIMES_EVERY_S:
            self._write(rank)

    def flush(self, force: bool = False) -> None:
        now = time.monotonic()
        for rank in list(self.pending):
            if force or now - self.last.get(rank, float("-inf")) >= LOG_TIMES_EVERY_S:
                self._write(rank)

    def close(self) -> None:
        self.flush(force=True)
        for fh in self.files.values():
            fh.close()
        self.files.clear()

    def _write(self, rank: int) -> None:
        end, wall = self.pending.pop(rank)
        self.last[rank] = time.monotonic()
        fh = self.files.get(rank)
        try:
            if fh is None:
                fh = self.files[rank] = _append(self.log_dir, rank_log_times_name(rank))
            fh.write(log_times_record(end, wall))
        except OSError:
            pass  # a full disk costs the Runs view its times, never the run
