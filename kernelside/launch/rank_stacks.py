"""Every rank's current Python stack, asked for while the run goes on.

Each rank registers ``faulthandler`` on ``STACKS_SIGNAL`` into its own ``rank<N>.stacks`` file in
the run folder (``worker/stack_signal.py``). faulthandler writes from a C signal handler, without
the GIL, so a rank answers even while its main thread is blocked inside a C-level collective
(a gloo ``barrier`` waiting for a peer): exactly when a person wants to know where it is.

Here, in the kernel that started the ranks (the only process that may signal them: it holds their
zombies, so a pid cannot have been reused), ``StackRequest.send`` signals each rank that has set its
file up, and ``collect`` waits for the dumps (bounded by ``ANSWER_TIMEOUT_S``) and parses them into
per-rank frames (file, line, function; cells named as the notebook shows them) and the
``torch.distributed`` collective the main thread waits in, if any. A rank that does not answer is
named with the reason. This module never imports torch: the answer is parsed from text.

Example::

    >>> req = StackRequest.send(run_dir, [(0, 4242, None), (1, 4243, None)])   # doctest: +SKIP
    >>> [r["collective"] for r in req.collect()["ranks"]]                       # doctest: +SKIP
    ['barrier', None]
"""

from __future__ import annotations

import dataclasses
import os
import re
import time

from ..short_traceback import is_nblaunch_file
from ..worker.stack_signal import HEADER, STACKS_SIGNAL, stacks_path

ANSWER_TIMEOUT_S = 0.5
MAX_FRAMES = 80  # per thread, innermost kept: a deep recursion must not make the answer huge
_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+|\?\?\?) in (.*)$')
_C10D = os.sep + os.path.join("torch", "distributed", "distributed_c10d.py")
_CELL = "<%%distributed cell "
_LIFECYCLE = os.sep + os.path.join("kernelside", "worker", "lifecycle.py")


@dataclasses.dataclass
class _Pending:
    rank: int
    pid: int
    path: str
    offset: int  # the file's size before the signal: the answer is what follows
    main: str  # the rank's main thread id, as faulthandler writes it (0x + 16 hex digits)


class StackRequest:
    """One request for stacks: the ranks signalled now, their answers read by ``collect()``."""

    def __init__(self, pending: list[_Pending], missing: dict[int, str]):
        self.pending, self.missing = pending, missing

    @classmethod
    def send(cls, run_dir: str, ranks) -> StackRequest:
        """Signal every live rank of ``ranks`` = [(rank, pid, exit_description or None)]; returns at once.

        Call it only from the process that started (and has not reaped) those pids.
        """
        pending, missing = [], {}
        for rank, pid, ended in ranks:
            if ended is not None:
                missing[rank] = f"rank {rank} has ended ({ended}): no stack to show"
                continue
            path = stacks_path(run_dir, rank)
            try:
                with open(path, "rb") as f:
                    head = f.readline().decode("ascii", "replace")
                    offset = f.seek(0, os.SEEK_END)
            except OSError:  # the rank sets its file up first thing: before that, a signal would kill it
                missing[rank] = f"rank {rank} is still starting: it cannot dump its stack yet (ask again in a moment)"
                continue
            if not head.startswith(HEADER):
                missing[rank] = f"rank {rank}'s stack file {path} is not nblaunch's: not signalled"
                continue
            try:
                os.kill(pid, STACKS_SIGNAL)
            except ProcessLookupError:
                missing[rank] = f"rank {rank} (pid {pid}) has just ended: no stack to show"
                continue
            main = "0x" + head[len(HEADER) :].strip().rjust(16, "0")
            pending.append(_Pending(rank, pid, path, offset, main))
        return cls(pending, missing)

    def collect(self, timeout: float = ANSWER_TIMEOUT_S, label=None) -> dict:
        """Wait (``timeout`` at most) for each signalled rank's dump; ``{"ranks": [...]}`` ordered by rank.

        Each entry: ``rank``, ``answered``, and either ``frames`` (main thread, outermost first),
        ``collective``, ``where``, ``threads`` (the other threads' frames), or ``reason``.
        ``label(filename, line)`` names a frame's place (the kernel maps cell files to ``In[N]``).
        """
        deadline = time.monotonic() + timeout
        texts: dict[int, str] = {}
        sizes: dict[int, int] = {}
        waiting = list(self.pending)
        while waiting:
            for p in list(waiting):
                try:
                    size = os.stat(p.path).st_size
                except OSError:
                    size = p.offset
                # faulthandler writes the whole dump from its handler at once: a size that grew and then
                # held still for one poll is a finished dump
                if size > p.offset and sizes.get(p.rank) == size:
                    texts[p.rank] = _read_from(p.path, p.offset)
                    waiting.remove(p)
                sizes[p.rank] = size
            if not waiting or time.monotonic() >= deadline:
                break
            time.sleep(0.01)
        ranks = [{"rank": r, "answered": False, "reason": why} for r, why in self.missing.items()]
        for p in self.pending:
            if p.rank in texts:
                ranks.append({"rank": p.rank, "answered": True, **parse_dump(texts[p.rank], p.main, label)})
            else:
                ranks.append({"rank": p.rank, "answered": False, "reason": _silence_reason(p, timeout)})
        ranks.sort(key=lambda r: r["rank"])
        return {"ranks": ranks}


def remove_files(run_dir: str) -> None:
    """The run is over: its ranks' stack files go (they only serve requests while it runs)."""
    try:
        names = os.listdir(run_dir)
    except OSError:
        return
    for name in names:
        if name.startswith("rank") and (name.endswith(".stacks") or ".stacks." in name):
            try:
                os.unlink(os.path.join(run_dir, name))
            except OSError:
                pass


def parse_dump(text: str, main: str, label=None) -> dict:
    """faulthandler's text → the main thread's frames (outermost first), its collective, the other threads."""
    threads: dict[str, list[dict]] = {}
    current = None
    for line in text.splitlines():
        m = _THREAD.match(line)
        if m:
            if m.group(2) in threads:
                break  # a thread seen again: the dump of a request asked just after this one begins
            current = threads[m.group(2)] = []
            continue
        m = _FRAME.match(line)
        if m and current is not None:
            lineno = int(m.group(2)) if m.group(2).isdigit() else None
            current.append(_frame(m.group(1), lineno, m.group(3), label))
    frames = _from_user_code(list(reversed(threads.pop(main, [])[:MAX_FRAMES])))
    collective = next((f["function"] for f in reversed(frames) if _is_collective(f)), None)
    user = [f for f in frames if f["user"]]
    where = user[-1]["where"] if user else (frames[-1]["where"] if frames else None)
    others = [{"thread": tid, "frames": list(reversed(fs[:MAX_FRAMES]))} for tid, fs in threads.items()]
    return {"frames": frames, "collective": collective, "where": where, "threads": others}


def describe(answer: dict) -> str:
    """One line per rank, as the cell or a log shows it: 'rank 1: cell In[3], line 4 — in barrier'."""
    lines = []
    for r in answer["ranks"]:
        if not r["answered"]:
            lines.append(f"rank {r['rank']}: {r['reason']}")
            continue
        line = f"rank {r['rank']}: {r['where'] or 'no Python frame'}"
        if r["collective"]:
            line += f", waiting in torch.distributed.{r['collective']}()"
        lines.append(line)
    return "\n".join(lines)


def kernel_label(filename: str, lineno: int | None) -> str | None:
    """In the kernel: a function defined in a notebook cell is named 'cell In[N], line L' (as tracebacks do)."""
    if "ipykernel_" not in filename and not filename.startswith("<ipython-input"):
        return None
    from .cuda_guard import describe_location  # the one place that maps IPython's cell files to In[N]

    return describe_location(filename, lineno)


def _frame(filename: str, lineno: int | None, function: str, label) -> dict:
    where = label(filename, lineno) if label is not None else None
    if where is None:
        where = _cell_place(filename, lineno) or f"{filename}:{lineno}"
    where += f" in {function}"
    library = any(part in filename for part in ("site-packages", "dist-packages", "/lib/python", "<frozen"))
    nblaunch = is_nblaunch_file(filename)
    return {
        "file": filename,
        "line": lineno,
        "function": function,
        "where": where,
        "user": not library and not nblaunch,
    }


def _from_user_code(frames: list[dict]) -> list[dict]:
    """Below the rank's ``run_work`` are nblaunch's and, for a forked rank, the kernel's own frames
    (the cell that called notebook_launcher): not where the rank is. Cut them off."""
    starts = [i for i, f in enumerate(frames) if f["function"] == "run_work" and f["file"].endswith(_LIFECYCLE)]
    if not starts or starts[-1] + 1 >= len(frames):
        return frames
    rest = frames[starts[-1] + 1 :]
    while len(rest) > 1 and is_nblaunch_file(rest[0]["file"]):  # the cell's runner (notebook/cell.py)
        rest = rest[1:]
    return rest


def _cell_place(filename: str, lineno: int | None) -> str | None:
    if filename.startswith(_CELL) and filename.endswith(">"):  # '<%%distributed cell In[3]>' (notebook/cell.py)
        return f"cell {filename[len(_CELL) : -1]}, line {lineno}"
    return None


def _is_collective(frame: dict) -> bool:
    return frame["file"].endswith(_C10D) and not frame["function"].startswith("_")


def _read_from(path: str, offset: int) -> str:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(1 << 20).decode("utf-8", "replace")


def _silence_reason(p: _Pending, timeout: float) -> str:
    why = f"rank {p.rank} did not answer within {timeout:g} s"
    try:
        with open(f"/proc/{p.pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return why + " (its process is gone)"
    reasons = {
        "T": "its process is stopped (SIGSTOP, or a debugger such as gdb holds it)",
        "t": "a debugger (gdb, py-spy) holds its process",
        "Z": "it has just exited",
        "D": "it waits in the operating system (disk or device I/O)",
    }
    return why + f" ({reasons.get(state, 'it may be ending')})"
