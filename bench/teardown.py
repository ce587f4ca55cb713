"""Teardown: from one rank's failure to the launching call returning, under every launcher.

    python -m bench.teardown            # 4 failure kinds x 5 launchers, median of 3 runs each
    python -m bench.teardown --quick    # SIGKILL only, 1 run per launcher
    python -m bench.teardown --busy 2   # with two busy processes beside it (a loaded machine)

Two workers do three all_reduces, then rank 1 fails while rank 0 enters the next all_reduce:
- *exception*: rank 1 raises RuntimeError (rank 0 sits in the all_reduce waiting for it);
- *SIGKILL*: rank 1 kills itself (what the out-of-memory killer does);
- *segfault*: rank 1 reads address 0 through ``ctypes.string_at(0)``;
- *exception + live thread*: as *exception*, but rank 1 has started a non-daemon thread (a logger,
  a metrics uploader): its interpreter cannot exit, so its sockets stay open and rank 0 is not
  told that its peer is gone (full run only).
Rank 1 writes the time just before failing; the "notebook" writes the time the launching call
returned (or raised). Launchers: nblaunch (fork, spawn), torch.multiprocessing.start_processes (fork,
process group set up by hand), torchrun (a subprocess of the notebook), Accelerate's notebook_launcher.

The launches run one after another in a "notebook" process (a driver started by this script). A
launch still running 60 s after the failure counts as a hang: this script then stops the driver and
everything under it, by pid, and a fresh driver goes on with the rest. After every launch it also
checks that no worker outlived the call.

Writes bench/results/teardown.md and prints it. Target (issue 6): under 5 s for nblaunch in every case.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time

from bench.harness import (
    REPO,
    BusyProcesses,
    adopt_orphans,
    descendants,
    free_port,
    heading,
    median,
    note,
    stop_tree,
    torchrun_cmd,
    write_result,
)

CAP_S = 60.0
START_S = 120.0  # to reach the failure at all (spawned interpreters on a busy 2-core machine)
KINDS = ("exception", "SIGKILL", "segfault", "exception + live thread")
LAUNCHERS = (
    "nblaunch fork",
    "nblaunch spawn",
    "torch.multiprocessing fork",
    "torchrun",
    "accelerate notebook_launcher",
)


def _stamp(path: str, text: str) -> None:
    with open(path + ".tmp", "w") as fh:
        fh.write(text)
    os.rename(path + ".tmp", path)


def fail(kind: str, run_dir: str) -> None:
    """In a worker: steady collectives, then rank 1 fails while rank 0 waits in all_reduce."""
    import ctypes
    import signal
    import threading

    import torch
    import torch.distributed as dist

    if not dist.is_initialized():  # torchrun and Accelerate leave this to the user
        dist.init_process_group("gloo")
    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t)
    if dist.get_rank() == 1:
        time.sleep(0.2)  # let rank 0 get into the all_reduce first
        _stamp(os.path.join(run_dir, "failed"), repr(time.time()))
        if kind == "exception":
            raise RuntimeError("injected failure on rank 1")
        if kind == "exception + live thread":
            # a background thread that is not a daemon (a logger, a metrics uploader...) keeps the
            # interpreter from exiting after the exception, so rank 1's sockets stay open
            threading.Thread(target=time.sleep, args=(3600,), name="uploader").start()
            raise RuntimeError("injected failure on rank 1 (a non-daemon thread is running)")
        if kind == "SIGKILL":
            os.kill(os.getpid(), signal.SIGKILL)
        if kind == "segfault":
            ctypes.string_at(0)
        if kind == "stall":  # not a failure: rank 1 stops answering (exercises the hang path of this script)
            time.sleep(3600)
    dist.all_reduce(t)


def _mp_entry(rank: int, world: int, port: int, kind: str, run_dir: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    fail(kind, run_dir)


TORCHRUN_SCRIPT = textwrap.dedent("""\
    import sys
    from bench.teardown import fail
    fail(sys.argv[1], sys.argv[2])
    """)


def _launch(launcher: str, kind: str, run_dir: str, script: str) -> str:
    """One launch that is meant to fail; returns the first line of what the call raised."""
    try:
        if launcher.startswith("nblaunch"):
            from kernelside import notebook_launcher

            method = launcher.split()[1]
            notebook_launcher(fail, args=(kind, run_dir), num_processes=2, start_method=method, output="none")
        elif launcher == "torch.multiprocessing fork":
            import torch.multiprocessing as mp

            mp.start_processes(_mp_entry, args=(2, free_port(), kind, run_dir), nprocs=2, start_method="fork")
        elif launcher == "torchrun":
            with open(os.path.join(run_dir, "torchrun.log"), "wb") as log:
                rc = subprocess.run(
                    torchrun_cmd(2, script, kind, run_dir),
                    stdout=log,
                    stderr=log,
                    env={**os.environ, "PYTHONPATH": REPO},
                ).returncode
            return f"torchrun exited with {rc}"
        else:
            from accelerate import notebook_launcher

            notebook_launcher(fail, args=(kind, run_dir), num_processes=2, use_port=str(free_port()))
    except BaseException as e:  # noqa: B036 - we want to see whatever the launcher raises
        rank = getattr(e, "rank", None)
        text = [ln for ln in str(e).splitlines() if any(c.isalnum() for c in ln)]
        first = (text or [""])[0].strip()[:160]
        return f"{type(e).__name__}{f' (rank {rank})' if rank is not None else ''}: {first}"
    return "returned normally"


def driver(jobs_json: str, sync: str) -> None:
    """The "notebook": failing launches one after another, waiting for this script's check after each.

    ``jobs_json`` lists [name, launcher, kind, runs]; run i of job ``name`` uses the folder ``sync/name-i``.
    """
    script = os.path.join(sync, "fail.py")
    if not os.path.exists(script):
        with open(script, "w") as fh:
            fh.write(TORCHRUN_SCRIPT)
    import torch.distributed  # noqa: F401  (a notebook has torch imported already)

    for name, launcher, kind, runs in json.loads(jobs_json):
        for i in range(runs):
            run_dir = os.path.join(sync, f"{name}-{i}")
            os.makedirs(run_dir)
            raised = _launch(launcher, kind, run_dir, script)
            _stamp(os.path.join(run_dir, "returned"), json.dumps({"t": time.time(), "raised": raised}))
            while not os.path.exists(os.path.join(run_dir, "checked")):
                time.sleep(0.01)


def _wait_for(path: str, deadline: float, proc: subprocess.Popen) -> bool:
    while not os.path.exists(path):
        if time.monotonic() > deadline or proc.poll() is not None:
            return os.path.exists(path)
        time.sleep(0.01)
    return True


def _start_driver(jobs: list, sync: str, log) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "bench.teardown", "--driver", json.dumps(jobs), sync],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def measure_all(jobs: list) -> dict[str, list[dict]]:
    """{job name: per run {"s": seconds or None (hang), "raised", "left": pids alive after the call}}.

    One driver runs every job; when a launch hangs, the driver and everything under it is stopped
    and a fresh driver takes the remaining jobs.
    """
    sync = tempfile.mkdtemp(prefix="nblaunch-bench-teardown-")
    log = open(os.path.join(sync, "driver.log"), "wb")
    results: dict[str, list[dict]] = {}
    todo = list(jobs)
    proc = None
    try:
        while todo:
            proc = _start_driver(todo, sync, log)
            hung = False
            for name, launcher, kind, runs in list(todo):
                for i in range(runs):
                    run_dir = os.path.join(sync, f"{name}-{i}")
                    failed, returned = os.path.join(run_dir, "failed"), os.path.join(run_dir, "returned")
                    if not _wait_for(failed, time.monotonic() + START_S, proc):
                        raise RuntimeError(f"{launcher}/{kind}: rank 1 never reached its failure; see {log.name}")
                    with open(failed) as fh:
                        t_fail = float(fh.read())
                    if not _wait_for(returned, time.monotonic() + CAP_S, proc):
                        stopped = stop_tree(proc.pid)
                        proc.wait()
                        r = {"s": None, "raised": f"hang: stopped {len(stopped)} processes by pid", "left": []}
                        results.setdefault(name, []).append(r)
                        note(f"{launcher}/{kind} run {i + 1}: hangs (> {CAP_S:.0f} s); stopped pids {stopped}")
                        hung = True
                        break
                    with open(returned) as fh:
                        ret = json.load(fh)
                    left = descendants(proc.pid)
                    if left:
                        stop_tree(proc.pid, spare=(proc.pid,))
                    results.setdefault(name, []).append({"s": ret["t"] - t_fail, "raised": ret["raised"], "left": left})
                    note(f"{launcher}/{kind} run {i + 1}: {results[name][-1]}")
                    open(os.path.join(run_dir, "checked"), "w").close()
                todo.pop(0)
                if hung:
                    break
            if not hung:
                proc.wait(timeout=60)
    finally:
        if proc is not None and proc.poll() is None:
            stop_tree(proc.pid)
            proc.wait()
        log.close()
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="SIGKILL only, 1 run per launcher")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--busy", type=int, default=0, help="busy processes beside the runs (default 0)")
    ap.add_argument("--driver", nargs=2, metavar=("JOBS", "DIR"), help=argparse.SUPPRESS)
    ns = ap.parse_args()
    if ns.driver:
        driver(ns.driver[0], ns.driver[1])
        return 0
    adopt_orphans()
    kinds, runs = (("SIGKILL",), 1) if ns.quick else (KINDS, ns.runs)
    jobs = [
        [f"j{i}", launcher, kind, runs] for i, (kind, launcher) in enumerate((k, la) for k in kinds for la in LAUNCHERS)
    ]
    with BusyProcesses(ns.busy):
        by_name = measure_all(jobs)
    results = {(launcher, kind): by_name.get(name, []) for name, launcher, kind, _ in jobs}
    stray = descendants()
    if stray:
        stop_tree()

    lines = [
        heading(
            "Teardown after a rank fails",
            "teardown",
            ns.quick,
            f"2 workers, median of {runs} run(s), each capped at {CAP_S:.0f} s after the failure"
            + (f", {ns.busy} busy processes beside it" if ns.busy else ""),
            flags=f" --busy {ns.busy}" if ns.busy else "",
        ),
        "",
        "Seconds from rank 1's failure to the launching call returning in the notebook process (rank 0 is "
        "waiting in an all_reduce when rank 1 fails):",
        "",
        "| launcher | " + " | ".join(kinds) + " |",
        "|---|" + "---|" * len(kinds),
    ]
    nb_worst = 0.0
    for launcher in LAUNCHERS:
        cells = []
        for kind in kinds:
            rs = results[(launcher, kind)]
            if any(r["s"] is None for r in rs):
                cells.append(f"hangs (>{CAP_S:.0f} s)")
                if launcher.startswith("nblaunch"):
                    nb_worst = float("inf")
                continue
            s = median(r["s"] for r in rs)
            left = sum(len(r["left"]) for r in rs)
            cells.append(f"{s:.2f}" + (f" ({left} processes outlived the call)" if left else ""))
            if launcher.startswith("nblaunch"):
                nb_worst = max(nb_worst, max(r["s"] for r in rs))
        lines.append(f"| {launcher} | " + " | ".join(cells) + " |")
    lines += ["", "What each call raised (last run):", "", "| launcher | failure | raised |", "|---|---|---|"]
    for (launcher, kind), rs in results.items():
        lines.append(f"| {launcher} | {kind} | {rs[-1]['raised'].replace('|', '/')} |")
    met = "met" if nb_worst < 5 else "NOT met"
    lines += ["", f"Target: under 5 s for nblaunch in every case — {met} (slowest nblaunch run: {nb_worst:.2f} s)."]
    if stray:
        lines.append(f"\nProcesses found after all runs (then stopped): {stray}.")
    write_result("teardown", ns.quick, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
