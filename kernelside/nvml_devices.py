"""The machine's NVIDIA GPUs through NVML (nvidia-ml-py's ``pynvml``), for the kernel and the Jupyter server.

One reader of NVML for everyone: the run report's per-rank figures (``launch/gpu_usage.py``), the Runs
view's per-process figures and the panel's hardware list (``jupyter_ext/``). NVML is the driver's
management library: asking it never creates a CUDA context and never imports torch, so the kernel can
still fork its ranks after asking, and the Jupyter server stays light.

Without nvidia-ml-py, without a driver or without GPUs, ``nvml()`` is None, the lists are empty and
the samplers answer nothing; reading NVML never raises to the caller.

Example::

    >>> describe_gpus()                      # on a machine without the NVIDIA driver
    []
    >>> NvmlSampler.all_devices().by_pid({os.getpid()})
    {}
"""

from __future__ import annotations

import os

# A registry of one: NVML is initialized once per process and never shut down (torch's own device
# count does the same), so no caller pays nvmlInit twice and none can shut it down under another.
_nvml_state: dict = {"module": None, "tried": False, "error": None}


def nvml():
    """The initialized pynvml module, or None (not installed, no driver, no GPU, no permission)."""
    if not _nvml_state["tried"]:
        _nvml_state["tried"] = True
        try:
            import pynvml

            pynvml.nvmlInit()
            _nvml_state["module"] = pynvml
        except ImportError:
            _nvml_state["error"] = "nvidia-ml-py (pynvml) is not installed"
        except Exception as e:  # NVMLError_LibraryNotFound, _DriverNotLoaded, _NoPermission, ...
            _nvml_state["error"] = f"NVML: {e}"
    return _nvml_state["module"]


def nvml_unavailable_reason() -> str | None:
    """Why there are no GPU figures (None when NVML works in this process).

    Example::

        >>> nvml_unavailable_reason()          # on a machine without the NVIDIA driver
        'NVML: NVML Shared Library Not Found'
    """
    nvml()
    return _nvml_state["error"]


def visible_nvml_indices(cvd: str | None, uuids: list[str]) -> list[int]:
    """The NVML indices of the GPUs CUDA shows a process with ``CUDA_VISIBLE_DEVICES=cvd``, in CUDA's order.

    ``uuids[i]`` is NVML device i's UUID ("GPU-…"); ``cvd`` None means every GPU. As CUDA does, the
    list ends at the first entry that names no GPU, or one already listed ("" and "-1" hide them all).
    MIG instances ("MIG-…") are not mapped.

    Example::

        >>> visible_nvml_indices("1,GPU-ab", ["GPU-ab12", "GPU-cd34"])
        [1, 0]
    """
    if cvd is None:
        return list(range(len(uuids)))
    found: list[int] = []
    for entry in (e.strip() for e in cvd.split(",")):
        index = _device_for_entry(entry, uuids)
        if index is None or index in found:
            break
        found.append(index)
    return found


def _device_for_entry(entry: str, uuids: list[str]) -> int | None:
    if entry.isdigit():
        return int(entry) if int(entry) < len(uuids) else None
    if entry.lower().startswith("gpu-"):
        hits = [i for i, u in enumerate(uuids) if u.lower().startswith(entry.lower())]
        return hits[0] if len(hits) == 1 else None  # an ambiguous prefix names no GPU
    return None


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def visible_handles(nv, cvd: str | None) -> list:
    """NVML handles of the GPUs CUDA shows a process with ``CUDA_VISIBLE_DEVICES=cvd``, in CUDA's order."""
    handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
    need_uuids = cvd is not None and "gpu-" in cvd.lower()
    uuids = [_text(nv.nvmlDeviceGetUUID(h)) for h in handles] if need_uuids else [""] * len(handles)
    return [handles[i] for i in visible_nvml_indices(cvd, uuids)]


def describe_gpus() -> list[dict]:
    """``[{"index", "name", "memory_bytes"}]`` for the GPUs this process's CUDA would see (its
    ``CUDA_VISIBLE_DEVICES``), numbered as CUDA numbers them; [] without NVML.

    Example::

        >>> describe_gpus()                  # doctest: +SKIP  (on a GPU machine)
        [{'index': 0, 'name': 'NVIDIA H200', 'memory_bytes': 150754820096}]
    """
    nv = nvml()
    if nv is None:
        return []
    try:
        handles = visible_handles(nv, os.environ.get("CUDA_VISIBLE_DEVICES"))
        return [
            {
                "index": i,
                "name": _text(nv.nvmlDeviceGetName(h)),
                "memory_bytes": int(nv.nvmlDeviceGetMemoryInfo(h).total),
            }
            for i, h in enumerate(handles)
        ]
    except Exception:  # a driver hiccup: no GPU list this time, never an error page
        return []


class NvmlSampler:
    """Reads, for a set of GPUs, which processes hold memory there and how busy they are.

    ``devices`` are ``(index, handle)`` pairs, the index being how the caller numbers that GPU. NVML's
    per-process utilization comes as samples since a timestamp: the sampler keeps the last one seen per
    GPU, and remembers the GPUs where NVML samples no processes (some VMs), then using the GPU's own.
    """

    def __init__(self, nv, devices: list[tuple[int, object]]):
        self.nv = nv
        self.devices = devices
        self._last_seen_us: dict[int, int] = {}
        self._no_process_util: set[int] = set()

    @classmethod
    def all_devices(cls) -> NvmlSampler:
        """A sampler over every GPU of the machine, numbered as NVML numbers them (no GPU: it samples nothing)."""
        nv = nvml()
        if nv is None:
            return cls(None, [])
        try:
            return cls(nv, [(i, nv.nvmlDeviceGetHandleByIndex(i)) for i in range(nv.nvmlDeviceGetCount())])
        except Exception:
            return cls(None, [])

    def processes(self, handle) -> list[tuple[int, int | None]]:
        """(pid, GPU memory in bytes or None where NVML cannot tell) of each compute process on ``handle``."""
        try:
            found = self.nv.nvmlDeviceGetComputeRunningProcesses(handle)
        except self.nv.NVMLError:
            return []
        return [(p.pid, p.usedGpuMemory if isinstance(p.usedGpuMemory, int) else None) for p in found]

    def process_util(self, index: int, handle) -> dict[int, float] | None:
        """pid -> SM utilization (%) from NVML's latest per-process sample; None where NVML has none."""
        if index in self._no_process_util:
            return None
        try:
            samples = self.nv.nvmlDeviceGetProcessUtilization(handle, self._last_seen_us.get(index, 0))
        except self.nv.NVMLError_NotSupported:
            self._no_process_util.add(index)
            return None
        except self.nv.NVMLError:
            return None  # NOT_FOUND: no sample since the last one
        latest: dict[int, tuple[int, float]] = {}
        for s in samples:
            if s.pid not in latest or s.timeStamp > latest[s.pid][0]:
                latest[s.pid] = (s.timeStamp, float(s.smUtil))
        if latest:
            self._last_seen_us[index] = max(t for t, _ in latest.values())
        return {pid: u for pid, (_, u) in latest.items()}

    def device_util(self, handle) -> int | None:
        """The GPU's own utilization (%) over NVML's last sample period, or None."""
        try:
            return int(self.nv.nvmlDeviceGetUtilizationRates(handle).gpu)
        except self.nv.NVMLError:
            return None

    def by_pid(self, pids: set[int]) -> dict[int, dict]:
        """``{pid: {"gpu_index", "gpu_memory_bytes", "gpu_util_percent"}}`` for those of ``pids`` on a GPU.

        Utilization is the process's own where NVML samples processes, else its GPU's. Never raises:
        a driver hiccup costs this sample's figures.
        """
        found: dict[int, dict] = {}
        if not pids or self.nv is None:
            return found
        try:
            for index, handle in self.devices:
                mine = [(pid, used) for pid, used in self.processes(handle) if pid in pids]
                if not mine:
                    continue
                own = self.process_util(index, handle) or {}
                gpu = self.device_util(handle) if any(pid not in own for pid, _ in mine) else None
                for pid, used in mine:
                    util = own.get(pid, gpu)
                    found[pid] = {"gpu_index": index, "gpu_memory_bytes": used, "gpu_util_percent": util}
        except Exception:
            return found
        return found
