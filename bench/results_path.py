"""A large return value's way back: nblaunch's --return against a pickle round trip in the kernel.

    python -m bench.results_path              # 256 MiB: a tensor, a numpy array, a state dict; median of 5
    python -m bench.results_path --quick      # 64 MiB tensor only, median of 2
    python -m bench.results_path --before ../main   # also the code of another checkout, in a kernel of its own

In one real kernel, for each object: a 2-rank one-shot ``%%distributed`` cell that makes it and brings it
back (``--return``), a cell that makes it and brings nothing back, and a pickle round trip
(``pickle.loads(pickle.dumps(x))``) of the same object in the kernel. The cost of the way back is the
difference of the two cells; the ratio is that over the round trip. Also the kernel's resident memory
after the value arrived, over the value's size (one copy: about 1.0x), and what is left in /dev/shm.
Cells alternate so that drift hits all alike. Then a tensor of the same size pushed into 2 and 8 live ranks
(``%distributed_push``), the way into the ranks.

Writes bench/results/results_path.md and prints it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from bench.harness import adopt_orphans, descendants, heading, note, start_kernel, stop_tree, write_result

MAKERS = {
    "tensor": "x = torch.arange({n} // 4, dtype=torch.int32)",
    "numpy array": "x = np.ones({n} // 8)",
    "state dict": "x = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range({n} // 2**22)]).state_dict()",
}

SETUP = """
%load_ext kernelside
import os, pickle, time, gc
import numpy as np, torch, psutil
def rss():
    gc.collect()
    return psutil.Process().memory_info().rss
def touch(x):
    # read every byte once, so that mapped memory counts in the kernel's resident set
    for v in (x.values() if isinstance(x, dict) else [x]):
        np.asarray(v).view(np.uint8).max()
    return True
"""


def _timed(k, code: str) -> float:
    t0 = time.perf_counter()
    cell = k.run(code, timeout=600)
    took = time.perf_counter() - t0
    if cell.error is not None:
        raise RuntimeError("cell failed:\n" + "\n".join(cell.error["traceback"]))
    return took


def _value(k, expr: str) -> float:
    cell = k.run(f"print(repr({expr}))", timeout=120)
    if cell.error is not None:
        raise RuntimeError("\n".join(cell.error["traceback"]))
    return float(cell.stdout.strip())


def measure(k, make: str, n: int, runs: int) -> dict:
    back = f"%%distributed -n 2 --return x\nimport numpy as np, torch\n{make.format(n=n)}"
    kept = f"%%distributed -n 2\nimport numpy as np, torch\n{make.format(n=n)}"
    local = f"{make.format(n=n)}\nt0 = time.perf_counter(); pickle.loads(pickle.dumps(x, protocol=5)); del x"
    got = {"back": [], "kept": [], "pickle": [], "rss": []}
    for _ in range(runs):
        _timed(k, "x = None")
        base = _value(k, "rss()")
        got["back"].append(_timed(k, back))
        got["rss"].append((_value(k, "touch(x) and rss()") - base) / n)
        _timed(k, "x = None")
        got["kept"].append(_timed(k, kept))
        _timed(k, local)
        got["pickle"].append(_value(k, "time.perf_counter() - t0"))
    return {key: statistics.median(v) for key, v in got.items()}


def push(k, n: int, ranks: int, runs: int) -> float:
    """Median seconds of ``%distributed_push`` of an ``n``-byte tensor (a new value each time) into live ranks."""
    _timed(k, f"%distributed_start -n {ranks}")
    try:
        took = []
        for i in range(runs):
            _timed(k, f"big = torch.full(({n} // 4,), {i}.0)")
            took.append(_timed(k, "%distributed_push big"))
        _timed(k, "del big")
        return statistics.median(took)
    finally:
        _timed(k, "%distributed_stop")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a 64 MiB tensor, 2 runs")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--before", metavar="PATH", help="another checkout: the same in a kernel of its own")
    ns = ap.parse_args()
    adopt_orphans()
    size, runs = (64 << 20, 2) if ns.quick else (256 << 20, ns.runs)
    makers = {"tensor": MAKERS["tensor"]} if ns.quick else MAKERS
    kernels = {"now": start_kernel()}
    if ns.before:
        kernels["before"] = start_kernel(pythonpath=os.path.abspath(ns.before))
    rows = []
    shm = f"/dev/shm/nblaunch-{os.getuid()}"
    try:
        for k in kernels.values():
            _timed(k, SETUP)
            _timed(k, "%%distributed -n 2 --return x\nx = 1")  # warm-up
        for what, make in makers.items():
            for name, k in kernels.items():
                note(f"{what} ({name})")
                rows.append((what, name, measure(k, make, size, runs)))
        pushes = []
        for ranks in (2,) if ns.quick else (2, 8):
            for name, k in kernels.items():
                note(f"push into {ranks} live ranks ({name})")
                pushes.append((ranks, name, push(k, size, ranks, runs)))
        left = os.listdir(shm) if os.path.isdir(shm) else []
    finally:
        for k in kernels.values():
            k.shutdown()
        orphans = descendants()
        stop_tree()
    lines = [
        heading(
            "A large return value's way back",
            "results_path",
            ns.quick,
            f"median of {runs} interleaved cells per object, one kernel, 2 ranks, fork + gloo",
            flags=f" --before {ns.before}" if ns.before else "",
        ),
        "",
        f"{size >> 20} MiB per object. Load average {os.getloadavg()[0]:.1f} at the end, on {os.cpu_count()} cores.",
        "",
        "| object | code | cell with --return | cell without | way back | pickle round trip | ratio | kernel memory |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for what, name, m in rows:
        way = m["back"] - m["kept"]
        lines.append(
            f"| {what} | {name} | {m['back']:.3f} s | {m['kept']:.3f} s | {way:.3f} s | {m['pickle']:.3f} s "
            f"| {way / m['pickle']:.2f}x | {m['rss']:.2f}x the value |"
        )
    pickled = statistics.median(m["pickle"] for what, _, m in rows if what == "tensor")
    lines += [
        "",
        f"`%distributed_push` of a {size >> 20} MiB tensor into live ranks (median of {runs}; a new value each time), "
        "against the tensor's pickle round trip above:",
        "",
        "| live ranks | code | push | ratio |",
        "|---|---|---|---|",
        *(f"| {r} | {name} | {t:.3f} s | {t / pickled:.2f}x |" for r, name, t in pushes),
    ]
    lines.append(f"\nLeft in {shm} after the runs: {left or 'nothing'} (this user's: other kernels' included).")
    if orphans:
        lines.append(f"Left running after the kernels' shutdown (stopped by pid): {orphans}")
    text = "\n".join(lines)
    write_result("results_path", quick=ns.quick, text=text)
    note(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
