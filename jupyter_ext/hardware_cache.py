"""The machine's hardware, probed once per server in a worker thread.

``kernelside.hardware_facts.detect_hardware`` reads the OS, NVML and torch's version file: the
server never imports torch and never initializes CUDA. The thread keeps NVML's first
initialization (a driver call that can take a moment) off the server's event loop.

Example::

    >>> info = asyncio.run(HardwareCache().get())
    >>> info["cpu_count"] >= 1
    True
"""

from __future__ import annotations

import asyncio

from kernelside.hardware_facts import detect_hardware


class HardwareCache:
    """Caches one ``detect_hardware()`` answer; ``get(refresh=True)`` probes again."""

    def __init__(self, probe=detect_hardware):
        self._probe = probe
        self._info: dict | None = None
        self._lock = asyncio.Lock()

    async def get(self, refresh: bool = False) -> dict:
        async with self._lock:
            if self._info is None or refresh:
                self._info = await asyncio.to_thread(self._probe)
            return self._info
