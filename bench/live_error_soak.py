"""Live errors in a row under load: does a live session ever lose its state while every rank process is alive?

    python -m bench.live_error_soak                 # 200 errors in a row, 2 and 4 ranks, two busy processes beside it
    python -m bench.live_error_soak --busy 0        # the same on a quiet machine
    python -m bench.live_error_soak --quick         # 20 errors, 2 ranks

In a real kernel, a live session holds a DDP model and a value each rank set. Then, ``--errors`` times in a row, one
rank (a different one each time) raises while every other rank waits in an ``all_reduce`` (the failing rank writes
the time just before raising). Counted: world restarts (a rank's pid changed, or the error says "restarted"), the
state kept (each rank's value and model still there after the errors), and, per error, the seconds from the
failure to the notebook naming it (the cell's error, or the session's "still waiting" line when a rank is slow to
come back), with the target: 2 s on a quiet machine, 4 s with two busy processes (issue 27).

Writes bench/results/live_error_soak.md and prints it.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from bench.harness import BusyProcesses, heading, median, note, start_kernel, write_result

SETUP = (
    "%%distributed\nimport torch, torch.distributed as dist, time\ntorch.manual_seed(0)\n"
    "model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 4))\nkept = rank"
)
FAIL = (
    "%%distributed\nt = torch.ones(1)\nif rank == {bad}:\n    time.sleep(0.2)\n"
    "    open({path!r}, 'w').write(repr(time.time())); raise ValueError('rank {bad} broke')\ndist.all_reduce(t)"
)
CHECK = (
    "%%distributed --return-from all --return ok\nok = kept == rank and isinstance(model, "
    "torch.nn.parallel.DistributedDataParallel)\nmodel(torch.randn(2, 16)).sum().backward()"
)
PIDS = "from kernelside.live.session import current\nprint([r['pid'] for r in current().status()])"


def soak(n: int, errors: int) -> dict:
    k = start_kernel()
    stamp = os.path.join(tempfile.mkdtemp(prefix="nblaunch-soak-"), "failed_at")
    named_s, restarts, unnamed = [], 0, 0
    try:
        k.run("%load_ext kernelside", timeout=120).ok()
        k.run(f"%distributed_start -n {n}", timeout=300).ok()
        k.run(SETUP, timeout=120).ok()
        pids = k.run(PIDS).ok().stdout
        for i in range(errors):
            named = {}

            def on_output(kind, content, named=named):
                text = content.get("text", "") if kind == "stream" else ""
                if "t" not in named and (kind == "error" or "Still waiting for rank(s)" in text):
                    named["t"] = time.time()

            cell = k.run(FAIL.format(bad=i % n, path=stamp), timeout=300, on_output=on_output)
            with open(stamp) as fh:
                failed_at = float(fh.read())
            if "t" in named:
                named_s.append(named["t"] - failed_at)
            else:
                unnamed += 1
            said = "\n".join(cell.error["traceback"]) if cell.error else ""
            now = k.run(PIDS).ok().stdout
            if now != pids or "restarted" in said:
                restarts += 1
                pids = now
                k.run(SETUP, timeout=120).ok()  # (the state is gone: made again for the next error)
            if (i + 1) % 20 == 0:
                note(f"{n} ranks: {i + 1}/{errors} errors, {restarts} restarts")
        k.run(CHECK, timeout=120).ok()
        kept = k.run("print(all(ok))").ok().stdout.strip() == "True"
    finally:
        k.run("%distributed_stop", timeout=120)
        k.shutdown()
    return {"named_s": named_s, "restarts": restarts, "unnamed": unnamed, "kept": kept}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--errors", type=int, default=None, help="errors in a row per size (default 200; --quick 20)")
    ap.add_argument("--busy", type=int, default=2, help="busy processes beside the soak (default 2)")
    a = ap.parse_args()
    errors = a.errors or (20 if a.quick else 200)
    sizes = (2,) if a.quick else (2, 4)
    target = 4.0 if a.busy else 2.0
    flags = (f" --errors {a.errors}" if a.errors else "") + (f" --busy {a.busy}" if a.busy != 2 else "")
    lines = [
        heading(
            f"Live errors in a row: {errors} rank errors while the peers wait in all_reduce",
            "live_error_soak",
            a.quick,
            f"{a.busy} busy processes beside it; named: failure → the cell's error or its 'still waiting' line",
            flags=flags,
        ),
        "",
        f"| ranks | errors | world restarts | state kept | named: median | p95 | max | within {target:g} s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    with BusyProcesses(a.busy):
        for n in sizes:
            note(f"{n} ranks, {errors} errors...")
            r = soak(n, errors)
            xs = sorted(r["named_s"])
            p95 = xs[min(len(xs) - 1, int(0.95 * len(xs)))] if xs else float("nan")
            within = sum(x <= target for x in xs)
            lines.append(
                f"| {n} | {errors} | {r['restarts']} | {'yes' if r['kept'] else 'no'} | {median(xs):.2f} s | "
                f"{p95:.2f} s | {max(xs):.2f} s | {within}/{errors}"
                + (f" ({r['unnamed']} never named)" if r["unnamed"] else "")
                + " |"
            )
    write_result("live_error_soak", a.quick, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
