"""Route the bytes workers write on fds 1/2: whole lines to the cell, everything to log files.

Lines are assembled per (rank, stream) before they are shown, so a line is never split or
merged with another rank's line. ``\\r``-terminated segments (text progress bars) count
as lines too. With ``output="rank0"`` a partial line that sits unfinished for a moment
(a prompt, ``print(..., end="")``) is shown anyway, since nothing else can interleave with
it; with ``output="all"`` it waits for its newline so ``[rank N]`` prefixes stay clean.

Every byte also goes, unmodified, to ``<log_dir>/rank<N>.log``, and the last lines of
each rank are kept for error messages.

Example::

    >>> r = RankOutputRouter(2, "rank0", log_dir, sys.stdout, sys.stderr)   # doctest: +SKIP
    >>> r.feed(0, "stdout", b"hello\\nwor"); r.feed(0, "stdout", b"ld\\n")
"""

from __future__ import annotations

import collections
import os
import time

TAIL_LINES = 40
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
    def __init__(self, world_size: int, mode: str, log_dir: str, stdout, stderr, prefix_template: str | None = None):
        self.mode = mode
        self.prefixes = {r: _prefix(prefix_template, mode, r) for r in range(world_size)}
        self.log_dir = log_dir
        self.sinks = {"stdout": stdout, "stderr": stderr}
        self.buffers = {(r, s): _LineBuffer() for r in range(world_size) for s in ("stdout", "stderr")}
        self.tails = {r: collections.deque(maxlen=TAIL_LINES) for r in range(world_size)}
        self.logs = {}
        self.log_paths = {}
        for r in range(world_size):
            path = os.path.join(log_dir, f"rank{r}.log")
            self.logs[r] = open(path, "ab", buffering=0)
            self.log_paths[r] = path

    def shown(self, rank: int) -> bool:
        return self.mode == "all" or (self.mode == "rank0" and rank == 0)

    def feed(self, rank: int, stream: str, data: bytes) -> None:
        self.logs[rank].write(data)
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
        for fh in self.logs.values():
            fh.close()
        for sink in self.sinks.values():
            try:
                sink.flush()
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
        prefix = self.prefixes[rank]
        if prefix:
            text = "".join(prefix + ln for ln in text.splitlines(keepends=True))
        self.sinks[stream].write(text)
