"""Live recovery: from one rank's failure to the cell's error, and to the next cell done, state kept or not.

    python -m bench.live_recovery                 # 2 and 4 ranks, 5 failures each, this code vs before
    python -m bench.live_recovery --quick         # 2 ranks, 2 failures each
    python -m bench.live_recovery --before REF    # the code compared against (default: 7faed43, before issue 19)

In a real kernel, a live session holds a DDP model and a value every rank set. Then, repeatedly,
rank 1 raises a second into a cell while every other rank waits in an ``all_reduce`` for it (the
rank writes the time just before raising). Measured from that moment: when the failed cell's error
reached the notebook, and when the next cell (one DDP step plus a read of the kept value on every
rank) was done; and whether the state survived. "before" is the same kernelside at ``--before``
(extracted with ``git archive`` into a temporary folder and run in its own kernel): it restarted the
world after the failure (new processes, state gone), so its next cell recreates the model first.

Writes bench/results/live_recovery.md and prints it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time

from bench.harness import REPO, heading, median, note, start_kernel, write_result

SETUP = (
    "%%distributed\nimport torch, torch.distributed as dist\ntorch.manual_seed(0)\n"
    "model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 8))\nkept = rank"
)
FAIL = (
    "%%distributed\nt = torch.ones(1)\nif rank == 1:\n    time.sleep(1)\n"
    "    open({path!r}, 'w').write(repr(time.time())); raise ValueError('rank 1 broke')\ndist.all_reduce(t)"
)
# the next cell: one DDP step, and whether every rank still has its model and value (else made again)
NEXT = (
    "%%distributed --return-from all --return ok\nimport torch\nok = 'kept' in globals() and kept == rank\n"
    "if 'model' not in globals():\n"
    "    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 8)); kept = rank\n"
    "model(torch.randn(4, 64)).sum().backward()"
)


def _code_before(ref: str, into: str) -> str:
    """kernelside/ as it was at ``ref``, extracted into ``into``; the folder to put on the kernel's path."""
    archive = subprocess.run(["git", "archive", ref, "kernelside"], cwd=REPO, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", into], input=archive.stdout, check=True)
    return into


def measure(pythonpath: str, n: int, failures: int) -> dict:
    k = start_kernel(pythonpath=pythonpath, cwd=pythonpath)
    stamp = os.path.join(tempfile.mkdtemp(prefix="nblaunch-bench-"), "failed_at")
    rows = {"error_s": [], "next_s": [], "kept": [], "pids_same": []}
    try:
        k.run("%load_ext kernelside\nimport os, time").ok()
        k.run(f"%distributed_start -n {n}").ok()
        k.run(SETUP).ok()
        pids = k.run("from kernelside.live.session import current\nprint([r['pid'] for r in current().status()])")
        for _ in range(failures):
            cell = k.run(FAIL.format(path=stamp), timeout=120)
            errored = time.time()
            assert cell.error is not None, "the failing cell did not fail"
            k.run(NEXT, timeout=120).ok()
            done = time.time()
            with open(stamp) as fh:
                failed_at = float(fh.read())
            kept = k.run("print(all(ok))").ok().stdout.strip() == "True"
            now = k.run("print([r['pid'] for r in current().status()])").stdout
            rows["error_s"].append(errored - failed_at)
            rows["next_s"].append(done - failed_at)
            rows["kept"].append(kept)
            rows["pids_same"].append(now == pids.stdout)
            k.run(SETUP).ok()  # (before: the state is made again for the next round)
            pids = k.run("print([r['pid'] for r in current().status()])")
    finally:
        k.run("%distributed_stop")
        k.shutdown()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--before", default="7faed43")
    a = ap.parse_args()
    sizes, failures = ((2,), 2) if a.quick else ((2, 4), 5)
    lines = [
        heading(
            "Live recovery: rank 1 raises while its peers wait in all_reduce",
            "live_recovery",
            a.quick,
            f"{failures} failures per row, medians, compared with kernelside at {a.before}",
            flags=f" --before {a.before}" if a.before != "7faed43" else "",
        ),
        "",
        "| ranks | code | failure → cell's error | failure → next cell done | state kept | same pids |",
        "|---|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory(prefix="nblaunch-before-") as before_dir:
        before = _code_before(a.before, before_dir)
        for n in sizes:
            figures = {}
            for name, path in (("this", REPO), ("before", before)):
                note(f"{n} ranks, {name}...")
                r = measure(path, n, failures)
                figures[name] = r
                lines.append(
                    f"| {n} | {name if name == 'this' else 'before (' + a.before + ')'} | "
                    f"{median(r['error_s']):.2f} s | {median(r['next_s']):.2f} s | "
                    f"{sum(r['kept'])}/{failures} | {sum(r['pids_same'])}/{failures} |"
                )
            ratio_e = median(figures["before"]["error_s"]) / median(figures["this"]["error_s"])
            ratio_n = median(figures["before"]["next_s"]) / median(figures["this"]["next_s"])
            lines.append(f"| {n} | ratio before/this | {ratio_e:.1f}x | {ratio_n:.1f}x | | |")
    write_result("live_recovery", a.quick, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
