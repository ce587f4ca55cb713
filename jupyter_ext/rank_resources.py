"""CPU, memory and (with nvidia-ml-py) GPU use of a live run's ranks, for the Runs view.

A pid from a state file is only looked at once it is proven to be that run's rank: the
process with that pid must have the start time (``/proc/<pid>/stat`` field 22) the kernel
recorded when it started the rank. A reused pid, or a pid a forged state file names, has
another start time (or none) and gets no figures. Nothing here ever signals a process.

Example::

    >>> sampler = RankSampler()
    >>> sampler.sample(os.getpid(), proc_start_time(os.getpid()))["rss_bytes"] > 0
    True
"""

from __future__ import annotations

import psutil

from kernelside.launch.run_state import proc_start_time  # the kernel's reading, the same one


def is_that_process(pid, recorded_start) -> bool:
    """True only if ``pid`` is alive and started at ``recorded_start`` (the identity the kernel wrote down)."""
    return recorded_start is not None and proc_start_time(pid) == recorded_start


class RankSampler:
    """Keeps one ``psutil.Process`` per live rank so CPU percentages compare two samples.

    A Process object holds no file descriptor; ``forget_ended()`` drops those of ended ranks.
    """

    def __init__(self):
        self._procs: dict[tuple[int, int], psutil.Process] = {}
        self._gpu = GpuUsage()

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
        return self._gpu.by_pid(pids)

    def forget_ended(self) -> None:
        """Drop the samplers of ranks that have ended (their pid no longer has the recorded start time)."""
        for key in [k for k in self._procs if not is_that_process(*k)]:
            del self._procs[key]


class GpuUsage:
    """Per-process GPU memory and the device's utilization through NVML, when nvidia-ml-py finds GPUs.

    Without the library or without GPUs it answers ``{}``, and the view shows no GPU columns.
    """

    def __init__(self):
        self._nvml = None
        self._tried = False

    def _load(self):
        if not self._tried:
            self._tried = True
            try:
                import pynvml  # nvidia-ml-py

                pynvml.nvmlInit()
                if pynvml.nvmlDeviceGetCount() > 0:
                    self._nvml = pynvml
            except Exception:  # no library, no driver, no GPU: no GPU columns
                self._nvml = None
        return self._nvml

    def by_pid(self, pids: set[int]) -> dict[int, dict]:
        nvml = self._load() if pids else None
        if nvml is None:
            return {}
        found: dict[int, dict] = {}
        try:
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                procs = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
                mine = [p for p in procs if p.pid in pids]
                if not mine:
                    continue
                util = nvml.nvmlDeviceGetUtilizationRates(handle).gpu
                for p in mine:
                    used = p.usedGpuMemory if isinstance(p.usedGpuMemory, int) else None
                    found[p.pid] = {"gpu_index": index, "gpu_memory_bytes": used, "gpu_util_percent": util}
        except Exception:  # a driver hiccup costs this sample's GPU figures, nothing else
            return found
        return found
