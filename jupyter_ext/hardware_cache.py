"""The machine's hardware, probed once per server in a worker thread.

``kernelside.launch.hardware.detect_hardware`` asks a short-lived child interpreter, so the server
process itself never initializes CUDA; the thread keeps the probe (a second or two of
importing torch) off the server's event loop.

Example::

    >>> info = asyncio.run(HardwareCache().get())
    >>> info["cpu_count"] >= 1
    True
"""

from __future__ import annotations

import asyncio

from kernelside.launch.hardware import detect_hardware


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
