"""A rank on another machine reports its own CPU, memory and GPU use, for the Runs dashboard.

The Jupyter server samples the ranks on its own machine from ``/proc`` (``jupyter_ext/rank_resources.py``);
a rank of a Ray world on another machine has a pid that names nothing there. So such a rank samples itself:
a daemon thread wakes every ``RESOURCES_EVERY_S`` and sends one JSON line on its ``resources`` connection
to the kernel (``live.ray_resources``), which writes them into the run folder for the server. The figures
are those the server takes of a local rank: ``cpu_percent`` (this process's CPU time over the wall time
since the last sample, 100 per busy core, None at first), ``rss_bytes`` and, on a GPU, NVML's
``gpu_index`` / ``gpu_memory_bytes`` / ``gpu_util_percent`` (``nvml_devices.NvmlSampler``, the reader the
server uses: no CUDA context, no torch). The thread never touches the rank's code, its events or its
locks: a cell pays nothing for it. A line the connection cannot take now is dropped (the next one
follows in a second); a closed connection ends the thread.

Example::

    >>> sample = OwnResources(gpu=False).sample()
    >>> sample["rss_bytes"] > 0 and sample["cpu_percent"] is None
    True
"""

from __future__ import annotations

import json
import os
import threading
import time

from ..run_contract import RESOURCES_EVERY_S


class OwnResources:
    """This process's figures, one ``sample()`` at a time (CPU percent between two samples)."""

    def __init__(self, gpu: bool):
        self._last: tuple[float, float] | None = None  # (monotonic, CPU seconds) of the sample before
        self._nvml = None
        if gpu:
            from ..nvml_devices import NvmlSampler

            self._nvml = NvmlSampler.all_devices()

    def sample(self) -> dict:
        now, times = time.monotonic(), os.times()
        cpu = times.user + times.system
        percent = None
        if self._last is not None and now > self._last[0]:
            percent = round(100.0 * (cpu - self._last[1]) / (now - self._last[0]), 1)
        self._last = (now, cpu)
        out = {"cpu_percent": percent, "rss_bytes": _rss()}
        if self._nvml is not None:
            out.update(self._nvml.by_pid({os.getpid()}).get(os.getpid(), {}))
        return out


def _rss() -> int | None:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def report_own_resources(fd: int, *, gpu: bool, every: float = RESOURCES_EVERY_S) -> threading.Thread:
    """Start the daemon thread that sends this process's figures on ``fd`` every ``every`` seconds."""
    os.set_blocking(fd, False)  # a kernel that reads nothing for a while costs samples, never a stuck thread
    thread = threading.Thread(target=_report, args=(fd, OwnResources(gpu), every), name="nblaunch-resources")
    thread.daemon = True
    thread.start()
    return thread


def _report(fd: int, own: OwnResources, every: float) -> None:
    try:
        while True:
            line = (json.dumps(own.sample()) + "\n").encode()
            try:
                os.write(fd, line)  # (a few dozen bytes: all of it or, on a full buffer, nothing)
            except BlockingIOError:
                pass
            except OSError:
                return  # the kernel's end: the rank ends with it anyway
            time.sleep(every)
    finally:
        os.close(fd)
