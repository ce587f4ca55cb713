"""Every rank's current Python stack, asked for while the run goes on.

Each rank answers in its own ``rank<N>.stacks`` file in the run folder, from a thread of its own that
waits on the FIFO ``rank<N>.stacks.ask`` (``worker/stack_answer.py``): no signal, so asking can never
hurt a rank, at any rate. The thread dumps with the GIL held, and a main thread blocked inside a C-level
collective (a gloo ``barrier`` waiting for a peer) has released it: the rank answers exactly when a
person wants to know where it is.

Here, in the kernel that started the ranks, ``StackRequest.send`` writes one byte into the FIFO of each
rank that has set its answer up (both opened inside the run folder, without following a link, and
accepted only as this user's FIFO and plain file), and ``collect`` waits for each rank's next answer
(bounded by ``ANSWER_TIMEOUT_S``) and parses it into per-rank frames (file, line, function; cells named
as the notebook shows them) and the ``torch.distributed`` collective the main thread waits in, if any.
A rank that does not answer is named with the reason. This module never imports torch: the answer is
parsed from text.

Example::

    >>> req = StackRequest.send(run_dir, [(0, 4242, None), (1, 4243, None)])   # doctest: +SKIP
    >>> [r["collective"] for r in req.collect()["ranks"]]                       # doctest: +SKIP
    ['barrier', None]
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import re
import stat
import time

from ..private_dir import folder_fd, open_in
from ..rank_place import cell_place, place_line
from ..short_traceback import is_nblaunch_file
from ..worker.stack_answer import ASK_SUFFIX, DETAIL, HEADER, stacks_path

ANSWER_TIMEOUT_S = 0.5
MAX_FRAMES = 80  # per thread, innermost kept: a deep recursion must not make the answer huge
MAX_ANSWER_BYTES = 1 << 20  # faulthandler writes at most 100 frames of 100 threads: far less than this
_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+|\?\?\?) in (.*)$')
_HEAD = re.compile(r"^" + re.escape(HEADER) + r"([0-9a-f]{1,16}) answer=([0-9]{1,18})$")
_C10D = os.sep + os.path.join("torch", "distributed", "distributed_c10d.py")
_LIFECYCLE = os.sep + os.path.join("kernelside", "worker", "lifecycle.py")
# a rank in these is returning the cell's result
_RESULT_FILES = tuple(os.sep + os.path.join("kernelside", "worker", f) for f in ("results.py", "sharded_results.py"))


@dataclasses.dataclass
class _Pending:
    rank: int
    pid: int
    name: str  # the answer file's name in the run folder
    seen: int  # the rank's answer count before this request: the answer is a later one
    main: str  # the rank's main thread id, as faulthandler writes it (0x + 16 hex digits)


class NotAnAnswer(Exception):
    """The stacks file is not a rank's answer (not nblaunch's, or not a plain file of this user's)."""


def read_answer(run_dir: str, name: str, whole: bool = True) -> tuple[str, int, str]:
    """(main thread id, answer count, text) of the answer file ``name`` in ``run_dir``; ``NotAnAnswer``
    if it is not one, ``OSError`` if it cannot be read (``FileNotFoundError``: not made yet)."""
    fd = open_in(run_dir, name, os.O_RDONLY | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        # (no link beyond its name; 0 links: the answer just replaced by the next one, still whole)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_nlink > 1:
            raise NotAnAnswer("not a plain file of this user's")
        data = os.read(fd, MAX_ANSWER_BYTES if whole else 128)
    finally:
        os.close(fd)
    head, _, text = data.partition(b"\n")
    m = _HEAD.match(head.decode("ascii", "replace"))
    if m is None:
        raise NotAnAnswer("not nblaunch's")
    return "0x" + m.group(1).rjust(16, "0"), int(m.group(2)), text.decode("utf-8", "replace")


def ask_rank(run_dir: str, name: str) -> None:
    """One byte into the rank's FIFO (non-blocking: a full FIFO already holds a request it will answer)."""
    fd = open_in(run_dir, name + ASK_SUFFIX, os.O_WRONLY | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISFIFO(st.st_mode) or st.st_uid != os.getuid():
            raise NotAnAnswer("its request FIFO is not a FIFO of this user's")
        try:
            os.write(fd, b"?")
        except BlockingIOError:
            pass
    finally:
        os.close(fd)


class StackRequest:
    """One request for stacks: the ranks asked now, their answers read by ``collect()``."""

    def __init__(self, run_dir: str, pending: list[_Pending], missing: dict[int, str]):
        self.run_dir, self.pending, self.missing = run_dir, pending, missing

    @classmethod
    def send(cls, run_dir: str, ranks) -> StackRequest:
        """Ask every live rank of ``ranks`` = [(rank, pid, exit_description or None)]; returns at once."""
        pending, missing = [], {}
        for rank, pid, ended in ranks:
            if ended is not None:
                missing[rank] = f"rank {rank} has ended ({ended}): no stack to show"
                continue
            name = os.path.basename(stacks_path(run_dir, rank))
            try:
                main, seen, _ = read_answer(run_dir, name, whole=False)
                ask_rank(run_dir, name)
            except NotAnAnswer as e:
                missing[rank] = f"rank {rank}'s stack file {stacks_path(run_dir, rank)} is {e}: not asked"
                continue
            except OSError as e:
                if e.errno == errno.ENXIO:  # a FIFO nobody reads: the rank's process is gone
                    missing[rank] = f"rank {rank} (pid {pid}) has just ended: no stack to show"
                else:  # the rank makes its answer file first thing: before that it cannot answer
                    missing[rank] = (
                        f"rank {rank} is still starting: it cannot show its stack yet (ask again in a moment)"
                    )
                continue
            pending.append(_Pending(rank, pid, name, seen, main))
        return cls(run_dir, pending, missing)

    def collect(self, timeout: float = ANSWER_TIMEOUT_S, label=None) -> dict:
        """Wait (``timeout`` at most) for each asked rank's answer; ``{"ranks": [...]}`` ordered by rank.

        Each entry: ``rank``, ``answered``, and either ``frames`` (main thread, outermost first),
        ``collective``, ``where``, ``source`` (its line's text), ``calling`` (the C function it calls, or
        None), ``threads`` (the other threads' frames), or ``reason``; ``taken``: when they were asked (wall).
        ``label(filename, line)`` names a frame's place (the kernel maps cell files to ``In[N]``).
        """
        taken = time.time()
        deadline = time.monotonic() + timeout
        texts: dict[int, str] = {}
        waiting = list(self.pending)
        while waiting:
            for p in list(waiting):
                try:
                    _, answers, text = read_answer(self.run_dir, p.name)
                except (OSError, NotAnAnswer):
                    continue
                if answers > p.seen:  # (the rank renames each answer into place whole)
                    texts[p.rank] = text
                    waiting.remove(p)
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
        return {"ranks": ranks, "taken": taken}


def remove_files(run_dir: str) -> None:
    """The run is over: its ranks' stack files go (they only serve requests while it runs)."""
    try:
        with folder_fd(run_dir) as dir_fd:
            for name in os.listdir(dir_fd):
                if name.startswith("rank") and (name.endswith(".stacks") or ".stacks." in name):
                    try:
                        os.unlink(name, dir_fd=dir_fd)
                    except OSError:
                        pass
    except OSError:
        return


def parse_dump(text: str, main: str, label=None) -> dict:
    """faulthandler's text → the main thread's frames (outermost first), its collective, the other threads."""
    threads: dict[str, list[dict] | None] = {}
    current = None
    detail: dict = {}
    for line in text.splitlines():
        if line.startswith(DETAIL):  # the rank's own words on its main thread (worker/stack_answer.main_detail)
            try:
                detail = json.loads(line[len(DETAIL) :])
            except ValueError:
                detail = {}
            detail = detail if isinstance(detail, dict) else {}
            continue
        m = _THREAD.match(line)
        if m:
            # the answering thread ('Current thread') is nblaunch's, not the rank's: left out
            current = threads[m.group(2)] = [] if m.group(1) == "Thread" or m.group(2) == main else None
            continue
        m = _FRAME.match(line)
        if m and current is not None:
            lineno = int(m.group(2)) if m.group(2).isdigit() else None
            current.append(_frame(m.group(1), lineno, m.group(3), label))
    frames = _from_user_code(list(reversed(threads.pop(main, [])[:MAX_FRAMES])))
    collective = next((f["function"] for f in reversed(frames) if _is_collective(f)), None)
    user = [f for f in frames if f["user"]]
    where = user[-1]["where"] if user else _outside_user_code(frames)
    others = [{"thread": t, "frames": list(reversed(fs[:MAX_FRAMES]))} for t, fs in threads.items() if fs is not None]
    source = detail.get("source") if isinstance(detail.get("source"), str) else ""
    calling = detail.get("calling") if isinstance(detail.get("calling"), str) and not collective else None
    return {
        "frames": frames,
        "collective": collective,
        "where": where,
        "source": source[:200],
        "calling": calling[:100] if calling else None,
        "threads": others,
    }


def describe(answer: dict) -> str:
    """One line per rank, as the cell or a log shows it: 'rank 1: cell In[3], line 4 — in barrier'."""
    lines = []
    for r in answer["ranks"]:
        if not r["answered"]:
            lines.append(f"rank {r['rank']}: {r['reason']}")
            continue
        lines.append(place_line(r["rank"], r["where"], collective=r["collective"], calling=r.get("calling")))
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
        where = cell_place(filename, lineno) or f"{filename}:{lineno}"
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


def _outside_user_code(frames: list[dict]) -> str | None:
    """Where a rank is when no frame of its stack is the user's: in a library (torch importing, say), that frame;
    in nblaunch's own code, what it is doing in words, never one of its file paths."""
    if not frames:
        return None
    if not is_nblaunch_file(frames[-1]["file"]):
        return frames[-1]["where"]
    if any(f["file"].endswith(_RESULT_FILES) for f in frames):
        return "after the cell's code, sending its result"
    return "in nblaunch, outside the cell's code"


def _is_collective(frame: dict) -> bool:
    return frame["file"].endswith(_C10D) and not frame["function"].startswith("_")


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
