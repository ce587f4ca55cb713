"""Live recovery: from one rank's failure to the cell's error, and to the next cell done, state kept or not.

    python -m bench.live_recovery                 # 2 and 4 ranks, 5 failures each, this code vs before
    python -m bench.live_recovery --quick         # 2 ranks, 2 failures each
    python -m bench.live_recovery --before REF    # the code compared against (default: 7faed43, before issue 19)
    python -m bench.live_recovery --against restart          # against a restart of the live world instead
    python -m bench.live_recovery --backend nccl --budget-s 60   # on GPUs (one per rank): against a restart

In a real kernel, a live session holds a DDP model and a value every rank set. Then, repeatedly,
rank 1 raises a second into a cell while every other rank waits for an ``all_reduce`` (in it under
gloo; on the GPU, in ``.item()`` of its result, under NCCL; the rank writes the time just before
raising). Measured from that moment: when the failed cell's error reached the notebook, and when
the next cell (one DDP step plus a read of the kept value on every rank) was done; and whether the
state survived. "before" is the same kernelside at ``--before`` (extracted with ``git archive`` into
a temporary folder and run in its own kernel): it restarted the world after the failure (new
processes, state gone), so its next cell recreates the model first. "restart" (``--against
restart``, and always with NCCL, whose recovery the code before did not have) is this code with
the world restarted after the failure (``%distributed_restart``), so the next cell makes the model
again: what a failure cost before, and what it costs wherever recovery in place is not possible.

NCCL needs a GPU per rank: rows for more ranks than GPUs are left out, said so. ``--budget-s``
stops starting failures once the next would pass it (the GPU kit's deadline); the rows say how many ran.

Writes bench/results/live_recovery.md (live_recovery-nccl.md with NCCL) and prints it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time

from bench.harness import REPO, gpus_described, heading, median, note, start_kernel, write_result

SETUP = (
    "%%distributed\nimport torch, torch.distributed as dist\ntorch.manual_seed(0)\n"
    "model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 8).to(device))\nkept = rank"
)
FAIL = (
    "%%distributed\nt = torch.ones(1, device=device)\nif rank == 1:\n    time.sleep(1)\n"
    "    open({path!r}, 'w').write(repr(time.time())); raise ValueError('rank 1 broke')\ndist.all_reduce(t)\nt.item()"
)
# the next cell: one DDP step, and whether every rank still has its model and value (else made again)
NEXT = (
    "%%distributed --return-from all --return ok\nimport torch\nok = 'kept' in globals() and kept == rank\n"
    "if 'model' not in globals():\n"
    "    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 8).to(device)); kept = rank\n"
    "model(torch.randn(4, 64, device=device)).sum().backward()"
)


def _code_before(ref: str, into: str) -> str:
    """kernelside/ as it was at ``ref``, extracted into ``into``; the folder to put on the kernel's path."""
    archive = subprocess.run(["git", "archive", ref, "kernelside"], cwd=REPO, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", into], input=archive.stdout, check=True)
    return into


def measure(pythonpath: str, n: int, failures: int, *, backend: str, restart: bool, deadline: float) -> dict:
    """``failures`` rounds (fewer when the next would start past ``deadline``, a monotonic time). ``restart``:
    the world is restarted after each failure, and the next cell makes the model again."""
    k = start_kernel(pythonpath=pythonpath, cwd=pythonpath)
    stamp = os.path.join(tempfile.mkdtemp(prefix="nblaunch-bench-"), "failed_at")
    rows = {"error_s": [], "next_s": [], "kept": [], "pids_same": []}
    pids_of = "print([r['pid'] for r in current().status()])"
    try:
        k.run("%load_ext kernelside\nimport os, time").ok()
        k.run(f"%distributed_start -n {n} --backend {backend}", timeout=300).ok()
        k.run(SETUP).ok()
        pids = k.run("from kernelside.live.session import current\n" + pids_of)
        round_s = 0.0
        for _ in range(failures):
            if time.monotonic() + round_s > deadline:
                break
            t_round = time.monotonic()
            cell = k.run(FAIL.format(path=stamp), timeout=120)
            errored = time.time()
            assert cell.error is not None, "the failing cell did not fail"
            if restart:  # (then the next cell makes the model again, as the code before had to)
                k.run("%distributed_restart", timeout=300).ok()
            k.run(NEXT, timeout=120).ok()
            done = time.time()
            with open(stamp) as fh:
                failed_at = float(fh.read())
            kept = k.run("print(all(ok))").ok().stdout.strip() == "True"
            now = k.run(pids_of).stdout
            rows["error_s"].append(errored - failed_at)
            rows["next_s"].append(done - failed_at)
            rows["kept"].append(kept)
            rows["pids_same"].append(now == pids.stdout)
            k.run(SETUP).ok()  # (before: the state is made again for the next round)
            pids = k.run(pids_of)
            round_s = max(round_s, time.monotonic() - t_round)
    finally:
        k.run("%distributed_stop")
        k.shutdown()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--before", default="7faed43")
    ap.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    ap.add_argument(
        "--against", choices=("before", "restart"), default=None, help="default: before (gloo), restart (nccl)"
    )
    ap.add_argument("--budget-s", type=float, default=None, help="start no failure round that would end after this")
    a = ap.parse_args()
    against = a.against or ("restart" if a.backend == "nccl" else "before")
    deadline = time.monotonic() + (a.budget_s if a.budget_s is not None else float("inf"))
    sizes, failures = ((2,), 2) if a.quick else ((2, 4), 5)
    skipped = []
    if a.backend == "nccl":
        from kernelside.launch.hardware import gpu_count

        gpus = gpu_count()
        skipped = [n for n in sizes if n > gpus]
        sizes = tuple(n for n in sizes if n <= gpus)
    flags = (f" --before {a.before}" if a.before != "7faed43" else "") + (
        f" --backend {a.backend}" if a.backend != "gloo" else ""
    )
    flags += f" --against {against}" if a.against else ""
    how = (
        f"compared with kernelside at {a.before}"
        if against == "before"
        else "compared with a restart of the live world"
    )
    lines = [
        heading(
            f"Live recovery ({a.backend}): rank 1 raises while its peers wait for an all_reduce",
            "live_recovery",
            a.quick,
            f"up to {failures} failures per row, medians, {how}",
            accel=f"{gpus_described()}, NCCL" if a.backend == "nccl" else "CPU/gloo",
            flags=flags,
        ),
        "",
        "| ranks | code | failures | failure → cell's error | failure → next cell done | state kept | same pids |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [f"| {n} | (not run) | | NCCL needs a GPU per rank: {n} ranks need {n} GPUs | | | |" for n in skipped]
    with tempfile.TemporaryDirectory(prefix="nblaunch-before-") as before_dir:
        other = ("before", _code_before(a.before, before_dir)) if against == "before" else ("restart", REPO)
        for n in sizes:
            figures = {}
            for name, path in (("this", REPO), other):
                note(f"{n} ranks, {name}...")
                r = measure(path, n, failures, backend=a.backend, restart=name == "restart", deadline=deadline)
                figures[name] = r
                label = {"this": "this", "before": f"before ({a.before})", "restart": "this, world restarted"}[name]
                done = len(r["error_s"])
                if not done:
                    lines.append(f"| {n} | {label} | 0 | (the budget was spent) | | | |")
                    continue
                lines.append(
                    f"| {n} | {label} | {done} | {median(r['error_s']):.2f} s | {median(r['next_s']):.2f} s | "
                    f"{sum(r['kept'])}/{done} | {sum(r['pids_same'])}/{done} |"
                )
            if all(figures[k]["error_s"] for k in figures):
                ratio_e = median(figures[other[0]]["error_s"]) / median(figures["this"]["error_s"])
                ratio_n = median(figures[other[0]]["next_s"]) / median(figures["this"]["next_s"])
                lines.append(f"| {n} | ratio {other[0]}/this | | {ratio_e:.1f}x | {ratio_n:.1f}x | | |")
    name = "live_recovery" if a.backend == "gloo" else "live_recovery-nccl"
    write_result(name, a.quick, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
