"""Per-rank GPU memory and utilization for the run report, read through NVML (nvidia-ml-py's ``pynvml``).

While a launch runs, the kernel loop samples at most once a second, and once more when a rank says
its code is done (before its memory is freed): for each GPU the plan gives the ranks, NVML lists the
processes holding memory there, and each process counts for the rank whose worker is that process
or one of its ancestors (DataLoader workers, a rank's own subprocesses). GPUs are numbered as the
kernel sees them: the plan's ``gpu_ids``, positions in the kernel's ``CUDA_VISIBLE_DEVICES``, whose
entries may be indices or ``GPU-<uuid>`` prefixes as CUDA accepts them. Utilization is the process's
own SM utilization where NVML samples processes, else its GPU's.

Without nvidia-ml-py, without a driver or without GPUs every call is a no-op and the report has no
GPU columns; reading NVML never fails a launch. The NVML calls are ``kernelside/nvml_devices.py``'s,
the one reader the Jupyter server's Runs view uses too; this module adds the ranks.

Example::

    >>> sampler = sampler_for((0,))      # the no-op sampler where NVML or the GPU is missing
    >>> sampler.available
    False
    >>> sampler.sample(report.ranks)     # doctest: +SKIP  (sets gpu_index, gpu_memory_bytes, gpu_util_percent)
"""

from __future__ import annotations

import dataclasses
import os
import time

from ..nvml_devices import NvmlSampler, nvml, nvml_unavailable_reason, visible_handles, visible_nvml_indices

SAMPLE_INTERVAL_S = 1.0
_handles_cache: dict = {}  # CUDA_VISIBLE_DEVICES -> NVML handles in the kernel's CUDA order

# nvml_unavailable_reason and visible_nvml_indices are nvml_devices', named here too for the report's readers
__all__ = [
    "GpuUsageSampler",
    "nvml_unavailable_reason",
    "parent_pid",
    "ranks_of",
    "sampler_for",
    "visible_nvml_indices",
]


def ranks_of(pids, rank_pids: dict[int, int], parent_of) -> dict[int, int]:
    """pid -> rank for every pid that is a rank's worker process or a descendant of one.

    ``parent_of(pid)`` gives the parent pid, or None once the process is gone.

    Example::

        >>> ranks_of([12, 30], {10: 0, 11: 1}, {12: 11, 30: 1}.get)
        {12: 1}
    """
    found = {}
    for pid in pids:
        p, hops = pid, 0
        while p is not None and p > 1 and hops < 64:
            if p in rank_pids:
                found[pid] = rank_pids[p]
                break
            p, hops = parent_of(p), hops + 1
    return found


def parent_pid(pid: int) -> int | None:
    """The parent of ``pid`` from /proc, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read()
    except OSError:
        return None
    return int(stat[stat.rfind(")") + 2 :].split()[1])  # the name in parentheses may hold spaces


@dataclasses.dataclass
class _RankFigures:
    gpu_index: int | None = None
    peak_bytes: int | None = None
    util_sum: float = 0.0
    util_samples: int = 0


class GpuUsageSampler:
    """Samples NVML for the ranks of one launch and writes the figures into their ``RankReport``\\s.

    A rank's ``gpu_memory_bytes`` is the most it held in any sample (it and its children, over its
    GPUs), ``gpu_index`` the GPU where it held most then, ``gpu_util_percent`` the mean over samples.
    """

    available = True

    def __init__(self, nv, devices: list[tuple[int, object]]):
        self._nvml = NvmlSampler(nv, devices)  # (the kernel's CUDA index, NVML handle)
        self._next = time.monotonic() + SAMPLE_INTERVAL_S
        self._figures: dict[int, _RankFigures] = {}

    def tick(self, ranks, now: float | None = None) -> None:
        """Sample if a second has passed since the last sample (the kernel loop calls this every turn)."""
        now = time.monotonic() if now is None else now
        if now >= self._next:
            self._next = now + SAMPLE_INTERVAL_S
            self.sample(ranks)

    def sample(self, ranks) -> None:
        """Read NVML once and update each rank's figures; never raises."""
        try:
            self._sample(ranks)
        except Exception:
            pass  # a launch never fails because its GPU figures could not be read

    def _sample(self, ranks) -> None:
        rank_pids = {r.pid: r.rank for r in ranks}
        held: dict[int, dict[int, int]] = {}  # rank -> {gpu index: bytes}
        known: set[int] = set()  # ranks for which NVML gave a memory figure (a VM may not)
        util: dict[int, float] = {}
        for index, handle in self._nvml.devices:
            procs = self._nvml.processes(handle)
            owners = ranks_of([pid for pid, _ in procs], rank_pids, parent_pid)
            if not owners:
                continue
            by_pid = self._nvml.process_util(index, handle)
            here: dict[int, float] = {}  # rank -> its processes' SM utilization on this GPU
            for pid, used in procs:
                rank = owners.get(pid)
                if rank is None:
                    continue
                on = held.setdefault(rank, {})
                on[index] = on.get(index, 0) + (used or 0)
                if used is not None:
                    known.add(rank)
                if by_pid is not None and pid in by_pid:
                    here[rank] = min(100.0, here.get(rank, 0.0) + by_pid[pid])
            if set(owners.values()) - set(here):
                gpu_util = self._nvml.device_util(handle)  # NVML sampled no process of that rank here: the GPU's own
                if gpu_util is not None:
                    here.update({rank: float(gpu_util) for rank in set(owners.values()) - set(here)})
            for rank, value in here.items():  # a rank on several GPUs: its busiest one
                util[rank] = max(util.get(rank, 0.0), value)
        for rr in ranks:
            on = held.get(rr.rank)
            if on is None:
                continue
            fig = self._figures.setdefault(rr.rank, _RankFigures())
            main = max(on, key=on.get)
            if fig.gpu_index is None:
                fig.gpu_index = main
            total = sum(on.values()) if rr.rank in known else None
            if total is not None and total >= (fig.peak_bytes or 0):
                fig.gpu_index, fig.peak_bytes = main, total
            if rr.rank in util:
                fig.util_sum += util[rr.rank]
                fig.util_samples += 1
            rr.gpu_index, rr.gpu_memory_bytes = fig.gpu_index, fig.peak_bytes
            if fig.util_samples:
                rr.gpu_util_percent = round(fig.util_sum / fig.util_samples, 1)


class _NoGpu:
    """The sampler where there is nothing to sample: every call does nothing."""

    available = False

    def tick(self, ranks, now: float | None = None) -> None:
        pass

    def sample(self, ranks) -> None:
        pass


NO_GPU = _NoGpu()


def _visible_handles(nv) -> list:
    """NVML handles of the GPUs this process's CUDA sees, in CUDA's order (cached per CUDA_VISIBLE_DEVICES)."""
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if cvd not in _handles_cache:
        _handles_cache[cvd] = visible_handles(nv, cvd)
    return _handles_cache[cvd]


def sampler_for(gpu_ids: tuple[int, ...]) -> GpuUsageSampler | _NoGpu:
    """A sampler for ranks on the kernel's GPUs ``gpu_ids``; the no-op one without GPUs or NVML.

    Example::

        >>> sampler_for(())            # a launch on CPU never touches NVML
        <kernelside.launch.gpu_usage._NoGpu object at ...>
    """
    if not gpu_ids:
        return NO_GPU
    nv = nvml()
    if nv is None:
        return NO_GPU
    try:
        handles = _visible_handles(nv)
    except Exception:
        return NO_GPU
    devices = [(k, handles[k]) for k in gpu_ids if k < len(handles)]
    return GpuUsageSampler(nv, devices) if devices else NO_GPU
