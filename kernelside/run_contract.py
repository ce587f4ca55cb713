"""The contract between the kernel that runs a launch and the Jupyter server that shows it: the run
folder's layout, the state file's schema, and the states a rank and a run can be in.

The kernel writes (``launch/run_dir.py``, ``launch/run_state.py``, ``launch/run_control.py``,
``live/run_entry.py``); the server extension reads (``jupyter_ext/``); the panel's TypeScript
(``jupyter_ext/src/types.ts``) spells the same states, and ``tests/test_run_contract.py`` fails if
any of them differs from the enums here. This module imports only the standard library, so that
the Jupyter server never loads torch by reading a run.

**Layout.** Every launch owns one folder ``run-<YYYYmmdd-HHMMSS>-<random>`` (mode 0700) under
``runs_base(log_dir)``::

    state.json     the run's state (STATE_FILE), replaced atomically, schema below
    .in-use        locked (flock) by the kernel for as long as the run is live (IN_USE_FILE)
    control.sock   the kernel's Stop channel while the run is live (CONTROL_SOCKET)
    rank<N>.log    rank N's output (rank_log_name(N))
    rank<N>.times  when it arrived (rank_log_times_name(N)): fixed-width LOG_TIMES_RECORD lines
                   "END WALL", the log had END bytes by WALL (seconds since the epoch); at most one
                   per LOG_TIMES_EVERY_S a rank, so a line takes the first record at or past its end
    rank<N>.stacks rank N's stacks, dumped on request (rank_stacks_name(N); the kernel reads them)
    series.jsonl   the run's curves and pace (SERIES_FILE), appended by the kernel, one JSON object a line:
                   {"kind": "metrics", "rank", "wall", "points": [{"step", name: value, ...}]} as metrics
                   arrive, and {"kind": "progress", "rank", "wall", "bar", "desc", "n", "total", "unit"}
                   at most every SERIES_PROGRESS_EVERY_S a bar (its last state always); at most
                   SERIES_MAX_BYTES (then one {"kind": "full"} line, and nothing more)
    resources.jsonl  what the ranks on other machines say of themselves (RESOURCES_FILE; a live world on Ray),
                   appended by the kernel about every RESOURCES_EVERY_S, one batch a write, one JSON object a line:
                   {"kind": "resources", "rank", "pid", "wall", "cpu_percent", "rss_bytes"} (and "gpu_index",
                   "gpu_memory_bytes", "gpu_util_percent" on a GPU); "wall" is the kernel's clock when it arrived.
                   Past RESOURCES_MAX_BYTES the file is replaced (by rename) by one holding the last batch

**State file** (``FORMAT_VERSION`` 1), a JSON object: ``version`` (the format: a server reads only its own
and lists any other with a note), ``nblaunch`` (the kernelside that wrote it), ``id``, ``engine``, ``control``
(the run takes Stop), ``notebook``, ``cell`` (the execution count of the cell that started it),
``flags`` (that cell's ``%%distributed`` flags), ``kernel_id``, ``kernel_pid``, ``kernel_pid_start``, ``started``
(wall time), ``updated``, ``updated_monotonic``, ``elapsed_s``, ``state`` (a ``RunState``),
``world_size``, ``backend``, ``start_method``, ``root_cause``, ``ranks`` (a list of ``{rank, pid,
pid_start, state (a RankState), exit, log, gpu}``, and ``node`` for a live world past one machine: the
rank's node as ``"IP (node id)"``, its ``pid_start`` null when that node is another machine) and, once
ended, ``ended`` and ``report``
(``{startup_s, wall_s, exit}``). A live session adds ``session``, ``cells_run``, ``restarts`` and
``last_cell``. ``pid_start`` is ``proc_start_time(pid)``: the server samples a pid only when that
process still has this start time.

Example::

    >>> RankState("idle").is_final
    False
    >>> RunState.STOPPED in FINAL_RUN_STATES
    True
    >>> RUN_ID.fullmatch("run-20250101-120000-ab12cd34") is not None
    True
"""

from __future__ import annotations

import enum
import os
import re
import tempfile

# -- the run folder ---------------------------------------------------------------------------

STATE_FILE = "state.json"
IN_USE_FILE = ".in-use"  # flock'ed by the kernel while the run is live: pruning and the server read it
CONTROL_SOCKET = "control.sock"
SERIES_FILE = "series.jsonl"
SERIES_MAX_BYTES = 32 << 20  # a run's curves stop growing here (an 8-rank run logging every step for hours)
SERIES_PROGRESS_EVERY_S = 0.5
RESOURCES_FILE = "resources.jsonl"
RESOURCES_EVERY_S = 1.0  # a rank on another machine samples itself this often (worker/own_resources.py)
RESOURCES_MAX_BYTES = 1 << 20  # then the file starts again with the last batch: only the latest counts
RESOURCES_FRESH_S = 5.0  # the server shows a rank's own figures only while they are this recent
# the figures a line may carry (numbers), as the server takes them of a local rank from /proc and NVML
RESOURCES_FIGURES = ("cpu_percent", "rss_bytes", "gpu_index", "gpu_memory_bytes", "gpu_util_percent")
FORMAT_VERSION = 1
RUN_PREFIX = "run-"
RUN_ID = re.compile(r"run-[0-9]{8}-[0-9]{6}-[A-Za-z0-9_]{1,64}")  # ASCII only (\\d takes "٢")


# Where a Stop was pressed, as the panel's POST .../stop names it ({"from": "dashboard"}), and how the
# cell's and the dashboard's words afterwards say it. A request that names no place came from the API.
STOP_PLACES = {
    "dashboard": "the run's dashboard",
    "sidebar": "the launch sidebar's runs list",
    "panel": "the launch panel",
}
DEFAULT_STOP_PLACE = "panel"


def stop_place_words(place: str | None) -> str:
    """How the words after a Stop name where it was pressed; an unknown place reads as the launch panel.

    Example::

        >>> stop_place_words("dashboard")
        "the run's dashboard"
    """
    return STOP_PLACES.get(place or DEFAULT_STOP_PLACE, STOP_PLACES[DEFAULT_STOP_PLACE])


def stopped_message(place: str | None = None) -> str:
    """The words of a stopped run, naming where Stop was pressed (``{"op": "stop", "from": "dashboard"}``).

    Example::

        >>> stopped_message("dashboard")
        "the run was stopped from the run's dashboard (Stop): every rank was stopped and nothing is left running"
    """
    where = stop_place_words(place)
    return f"the run was stopped from {where} (Stop): every rank was stopped and nothing is left running"


def runs_base(log_dir: str | None) -> str:
    """The folder that holds the run folders: ``log_dir``, or ``$TMPDIR/nblaunch-<uid>``.

    Example::

        >>> runs_base("/data/logs")
        '/data/logs'
    """
    return log_dir or os.path.join(tempfile.gettempdir(), f"nblaunch-{os.getuid()}")


LOG_TIMES_EVERY_S = 0.05  # a rank's log gets a time record at most this often
LOG_TIMES_RECORD = 39  # bytes of one record: f"{end:020d} {wall:017.6f}\n"


def log_times_record(end: int, wall: float) -> bytes:
    """One record of a ``rank<N>.times`` file.

    Example::

        >>> log_times_record(12, 1700000000.5)
        b'00000000000000000012 1700000000.500000\n'
    """
    return f"{end:020d} {wall:017.6f}\n".encode()


def rank_log_times_name(rank: int) -> str:
    """The file name of the times of rank ``rank``'s log (``rank<N>.times``, beside ``rank<N>.log``)."""
    return f"rank{rank}.times"


def rank_log_name(rank: int) -> str:
    """The file name of rank ``rank``'s log inside its run folder.

    Example::

        >>> rank_log_name(3)
        'rank3.log'
    """
    return f"rank{rank}.log"


def rank_stacks_name(rank: int) -> str:
    """The file name where rank ``rank`` dumps its stacks when its kernel asks (``worker/stack_answer.py``).

    Example::

        >>> rank_stacks_name(0)
        'rank0.stacks'
    """
    return f"rank{rank}.stacks"


def proc_start_time(pid: int | None) -> int | None:
    """A process's start time in clock ticks after boot (``/proc/<pid>/stat`` field 22), or None.

    With the pid, it names one process for good: a reused pid has another start time.

    Example::

        >>> proc_start_time(os.getpid()) > 0
        True
    """
    st = proc_stat(pid)
    return st[1] if st is not None else None


def proc_stat(pid: int | None) -> tuple[int, int, str] | None:
    """(parent pid, start time in ticks after boot, state letter) from ``/proc/<pid>/stat``, or None when gone.

    Example::

        >>> proc_stat(os.getpid())[0] == os.getppid()
        True
    """
    if not pid:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: count fields after its last ')'
    fields = stat[stat.rfind(b")") + 2 :].split()
    try:
        return int(fields[1]), int(fields[19]), fields[0].decode()  # fields 4, 22 and 3 overall
    except (IndexError, ValueError):
        return None


# -- states -----------------------------------------------------------------------------------


class _Word(str, enum.Enum):
    """A state that is its word everywhere: in JSON, in f-strings, compared with a plain string."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class RankState(_Word):
    """Where one rank is. The run recorder (``launch/recorder.py``, ``RunRecorder._move``) alone moves
    it; the widgets' status line, the failure message, the state file, the server and the panel read it.

    A rank of a one-shot launch::

        STARTING ─ready─▶ RUNNING ─its code returned (or exit 0)─▶ DONE
            │                 ├─raised, exited badly, died, left while peers waited─▶ FAILED
            └─────────────────┴─stopped by nblaunch (another rank failed, timeout, Stop, ■)─▶ STOPPED

    A rank of a live session (``%distributed_start``) stays up between requests::

        STARTING ─idle─▶ IDLE ─request sent─▶ BUSY ─idle for that request (whatever its outcome)─▶ IDLE
            └──────────────┴──────────────────┴──process gone, or the session ended──▶ DEAD

    DONE, FAILED, STOPPED and DEAD are final (``is_final``), with one exception: a DONE rank whose
    process then exits badly on its own becomes FAILED.
    """

    STARTING = "starting"  # the process exists; it has not reached user code yet
    RUNNING = "running"  # one-shot: running the user's code
    IDLE = "idle"  # live: waiting for the next request, its namespace kept
    BUSY = "busy"  # live: running a request (a cell, a push)
    DONE = "done"  # one-shot: its code returned (or it exited 0)
    FAILED = "failed"  # raised, exited badly or died (signal); the root cause is one of these
    STOPPED = "stopped"  # stopped by nblaunch before it finished
    DEAD = "dead"  # live: its process is gone (the session ended, or it died)

    @property
    def is_final(self) -> bool:
        """True for the states a rank never leaves (DONE, FAILED, STOPPED, DEAD)."""
        return self in FINAL_RANK_STATES


FINAL_RANK_STATES = frozenset({RankState.DONE, RankState.FAILED, RankState.STOPPED, RankState.DEAD})
ACTIVE_RANK_STATES = frozenset({RankState.RUNNING, RankState.BUSY})  # running code the user asked for


class RunState(_Word):
    """Where a whole run is, as its state file says (the kernel writes all but the last two).

    ``STARTING → RUNNING → DONE | FAILED | TIMEOUT | INTERRUPTED | STOPPED`` for a launch; a live
    session goes ``STARTING → IDLE ⇄ RUNNING`` and ends ``DONE`` (``%distributed_stop``), ``STOPPED``
    (Stop from the panel) or ``FAILED``. The server shows ``LOST`` for a run whose file says it is
    live while no kernel holds its folder (the kernel died mid-run), and ``UNKNOWN`` for a file it
    cannot read.
    """

    STARTING = "starting"
    RUNNING = "running"
    IDLE = "idle"
    DONE = "done"
    FAILED = "failed"
    TIMEOUT = "timeout"
    INTERRUPTED = "interrupted"
    STOPPED = "stopped"
    LOST = "lost"  # the server's verdict, never written by a kernel
    UNKNOWN = "unknown"  # the server's verdict, never written by a kernel


LIVE_RUN_STATES = (RunState.STARTING, RunState.RUNNING, RunState.IDLE)
FINAL_RUN_STATES = (RunState.DONE, RunState.FAILED, RunState.TIMEOUT, RunState.INTERRUPTED, RunState.STOPPED)
WRITTEN_RUN_STATES = LIVE_RUN_STATES + FINAL_RUN_STATES  # what a kernel may write into ``state``
