"""JupyterLab's debugger on, cells on engines whose ranks it does not reach: Ray (one-shot and live) and torch's
elastic launcher (two kernels as two machines, one rendezvous on 127.0.0.1).

Run by test_visual_debugger_engines.py inside a loopback-only network namespace. Kernel 0 has its debugger on
(driven as JupyterLab drives it) and a breakpoint set in each cell's gutter; kernel 1 is the elastic launch's
second machine, debugger off. Prints one JSON object: what each cell showed, and the debugger's stop events.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading

from kernel import Kernel
from kernel_debugger import KernelDebugger, set_breakpoints

RAY_CELL = "%%distributed -n 2 --engine ray --return-from all --return seen\nseen = rank * 10\nafter = seen + 1\n"
LIVE_CELL = "%%distributed --return-from all --return kept\nkept = rank + 7\nafter = kept\n"
ELASTIC_CELL = "%%distributed --config {config} --return seen\nseen = rank * 10\nafter = seen + 1\n"
ELASTIC_CONFIG = """num_machines: 2
machine_rank: {node}
num_processes: 4
main_process_ip: 127.0.0.1
main_process_port: {port}
rdzv_backend: c10d
"""


def shown(cell) -> dict:
    return {
        "stdout": cell.stdout,
        "stderr": cell.stderr,
        "result": (cell.result or {}).get("text/plain"),
        "error": [cell.error["ename"], cell.error["evalue"]] if cell.error else None,
    }


def main() -> None:
    port = int(sys.argv[1])
    kernels = [Kernel(), Kernel()]
    d = KernelDebugger(kernels[0])
    out: dict = {}
    try:
        assert d.start()["isStarted"]
        for k in kernels:
            k.run("%load_ext kernelside").ok()
        k = kernels[0]
        set_breakpoints(d, RAY_CELL, [3])
        out["ray"] = shown(k.run(RAY_CELL, timeout=300))
        out["ray_seen"] = k.run("seen").result["text/plain"]
        set_breakpoints(d, LIVE_CELL, [3])
        out["live_start"] = shown(k.run("%distributed_start -n 2 --engine ray", timeout=300))
        out["live"] = [shown(k.run(LIVE_CELL, timeout=120)) for _ in range(2)]
        out["live_kept"] = k.run("kept").result["text/plain"]
        k.run("%distributed_stop", timeout=120).ok()
        k.run("import ray; ray.shutdown()", timeout=120).ok()
        out["elastic"] = elastic(kernels, d, port)
        out["elastic_seen"] = [k.run("seen").result["text/plain"] for k in kernels]
        out["stops"] = [e for e in d.events if e["event"] == "stopped"]
    finally:
        d.stop()
        for k in kernels:
            k.shutdown()
    print(json.dumps(out))


def elastic(kernels, d: KernelDebugger, port: int) -> list[dict]:
    """The same cell on both "machines" at once, each reading its own nblaunch.yaml (num_machines: 2)."""
    cells: list = [None, None]
    paths = [os.path.join(tempfile.gettempdir(), f"nblaunch-dbg-node{n}-{os.getpid()}.yaml") for n in (0, 1)]
    for node, path in enumerate(paths):
        with open(path, "w") as fh:
            fh.write(ELASTIC_CONFIG.format(node=node, port=port))
    codes = [ELASTIC_CELL.format(config=path) for path in paths]
    set_breakpoints(d, codes[0], [3])

    def one(node):
        cells[node] = kernels[node].run(codes[node], timeout=240)

    threads = [threading.Thread(target=one, args=(n,)) for n in (0, 1)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for path in paths:
            os.unlink(path)
    return [shown(c) for c in cells]


if __name__ == "__main__":
    main()
