"""CPU, memory and (with nvidia-ml-py) GPU use of a live run's ranks, for the Runs view.

GPU figures come from ``kernelside.nvml_devices.NvmlSampler``, the NVML reader the kernel's run
report uses too (GPUs numbered as NVML numbers them: the server has no CUDA_VISIBLE_DEVICES to follow).

A pid from a state file is only looked at once it is proven to be that run's rank: the
process with that pid must have the start time (``/proc/<pid>/stat`` field 22) the kernel
recorded when it started the rank. A reused pid, or a pid a forged state file names, has
another start time (or none) and gets no figures. Nothing here ever signals a process.

A rank of a live world on another machine (a Ray node elsewhere: its ``node`` is set, its ``pid_start`` null)
has no process here to read; it reports its own figures, which its kernel appends to the run folder's
``resources.jsonl`` (``run_contract.RESOURCES_FILE``). ``reported_figures`` takes each such rank's latest
line from there: only one of that rank's pid, and only while it is recent (``RESOURCES_FRESH_S`` by this
machine's clock, which the kernel wrote it by).

Example::

    >>> sampler = RankSampler()
    >>> sampler.sample(os.getpid(), proc_start_time(os.getpid()))["rss_bytes"] > 0
    True
"""

from __future__ import annotations

import json

import psutil

from kernelside.nvml_devices import NvmlSampler
from kernelside.run_contract import (
    RESOURCES_FIGURES,
    RESOURCES_FILE,
    RESOURCES_FRESH_S,
    proc_start_time,  # the kernel's reading, the same one
)

from .run_files import RunDir, RunFileError

__all__ = ["RankSampler", "is_that_process", "proc_start_time", "reported_figures"]


def is_that_process(pid, recorded_start) -> bool:
    """True only if ``pid`` is alive and started at ``recorded_start`` (the identity the kernel wrote down)."""
    return recorded_start is not None and proc_start_time(pid) == recorded_start


class RankSampler:
    """Keeps one ``psutil.Process`` per live rank so CPU percentages compare two samples.

    A Process object holds no file descriptor; ``forget_ended()`` drops those of ended ranks.
    """

    def __init__(self):
        self._procs: dict[tuple[int, int], psutil.Process] = {}
        self._gpu: NvmlSampler | None = None  # NVML is asked once a live run has ranks to show

    def sample(self, pid, recorded_start) -> dict | None:
        """``{"cpu_percent", "rss_bytes"}`` for a proven rank (cpu_percent None on the first sample), else None."""
        if not is_that_process(pid, recorded_start):
            return None
        key = (pid, recorded_start)
        proc = self._procs.get(key)
        first = proc is None
        try:
            if first:
                proc = self._procs[key] = psutil.Process(pid)
            with proc.oneshot():
                cpu = proc.cpu_percent(None)
                rss = proc.memory_info().rss
            if proc.status() == psutil.STATUS_ZOMBIE:
                return None  # ended; its parent has not reaped it yet
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            self._procs.pop(key, None)
            return None
        return {"cpu_percent": None if first else round(cpu, 1), "rss_bytes": rss}

    def gpu(self, pids: set[int]) -> dict[int, dict]:
        """``{pid: {"gpu_index", "gpu_memory_bytes", "gpu_util_percent"}}`` for those of ``pids`` on a GPU."""
        if not pids:
            return {}
        if self._gpu is None:
            self._gpu = NvmlSampler.all_devices()
        return self._gpu.by_pid(pids)

    def forget_ended(self) -> None:
        """Drop the samplers of ranks that have ended (their pid no longer has the recorded start time)."""
        for key in [k for k in self._procs if not is_that_process(*k)]:
            del self._procs[key]


def reported_figures(d: RunDir, ranks: list[dict], now: float) -> dict[int, dict]:
    """``{rank: figures}`` from the run's ``resources.jsonl`` for those of ``ranks`` that are on another
    machine: each one's latest line, if it names the rank's pid and came within ``RESOURCES_FRESH_S`` of ``now``."""
    away = {r["rank"]: r.get("pid") for r in ranks if r.get("node") and r.get("pid_start") is None}
    if not away:
        return {}
    try:
        text = d.read_log(RESOURCES_FILE, tail=2 * len(ranks) + 2)["text"]
    except RunFileError:
        return {}  # none yet (a rank reports after its first second), or not a plain file of ours
    found: dict[int, dict] = {}
    for line in text.splitlines():
        try:
            said = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if not isinstance(said, dict) or said.get("kind") != "resources":
            continue
        rank, wall = said.get("rank"), said.get("wall")
        if rank not in away or said.get("pid") != away[rank] or not isinstance(wall, (int, float)):
            continue
        if abs(now - wall) <= RESOURCES_FRESH_S:
            found[rank] = {k: said[k] for k in RESOURCES_FIGURES if isinstance(said.get(k), (int, float))}
    return found
