"""Stacks asked for at any rate never hurt a run: requests at once against a gloo ``all_reduce`` loop.

    python -m bench.stacks_soak                      # 10,000 requests at 4 at once; 20,000 direct asks, now and before
    python -m bench.stacks_soak --quick              # 500 requests, 2,000 direct asks
    python -m bench.stacks_soak --against none       # without the old way's run

In a real kernel a ``%%distributed -n 4`` cell loops over ``all_reduce`` (gloo) until told to stop. Meanwhile
``--concurrency`` threads send ``{"op": "stacks"}`` to the run's control socket, as the dashboard's Stacks
button (``POST /nblaunch/runs/{id}/stacks``) does, ``--requests`` times in all. Counted: ranks crashed (the
cell failed), requests answered by every rank, by some, refused; each request's seconds; and the loop's
steps per second before and during the requests (does asking slow the run?).

Then ``--hammer`` asks of every rank directly, 1 ms apart per thread, not waiting for answers: a byte into each
rank's request FIFO (now), and, with ``--against signal`` (the default), what nblaunch did before issue 28: each
rank registers ``faulthandler`` for a real-time signal with ``all_threads=True`` and the threads send that
signal to every rank (``os.kill``, as the kernel did), until a rank crashes or all were sent.

Writes bench/results/stacks_soak.md and prints it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import tempfile
import threading
import time

LOOP = """%%distributed -n {n} --backend gloo
import os, time, torch, torch.distributed as dist
{prelude}
t = torch.zeros(4096)
steps = 0
while True:
    t.zero_()
    if rank == 0:
        t[0] = float(os.path.exists({stop!r}))
    dist.all_reduce(t)
    if t[0] > 0:
        break
    steps += 1
    work = sum(i * i for i in range(2000))  # Python between collectives, as a training step has: frames come and go
    if rank == 0 and steps % 20 == 0:
        with open({count!r} + ".tmp", "w") as f:
            f.write(repr((time.monotonic(), steps)))
        os.replace({count!r} + ".tmp", {count!r})
print("steps", steps)
"""
OLD_SIGNAL = signal.SIGRTMIN + 5
OLD_PRELUDE = (
    "import faulthandler, signal\n"
    "faulthandler.register(signal.SIGRTMIN + 5, file=open(os.devnull, 'w'), all_threads=True, chain=False)"
)


def _running_folder(base: str, n: int):
    try:
        names = os.listdir(base)
    except OSError:
        return None
    for name in names:
        d = os.path.join(base, name)
        try:
            with open(os.path.join(d, "state.json")) as f:
                state = json.load(f)
        except (OSError, ValueError):
            continue
        ready = all(os.path.exists(os.path.join(d, f"rank{r}.stacks")) for r in range(n))
        if state.get("state") == "running" and ready and len(state.get("ranks", [])) == n:
            return d, [r["pid"] for r in state["ranks"]]
    return None


def _steps(count_file: str):
    try:
        with open(count_file) as f:
            return eval(f.read())  # noqa: S307 - (time, steps), written by the bench's own cell
    except (OSError, SyntaxError):
        return None


def _rate(count_file: str, seconds: float) -> float:
    """The loop's steps per second over ``seconds`` (rank 0's own clock and count)."""
    a = _steps(count_file)
    time.sleep(seconds)
    b = _steps(count_file)
    if a is None or b is None or b[0] <= a[0]:
        return 0.0
    return (b[1] - a[1]) / (b[0] - a[0])


MODES = {
    "route": "answering thread, through the kernel (now)",
    "fifo": "answering thread, asked directly every 1 ms (now)",
    "signal": "faulthandler signal handler, signalled every 1 ms (before)",
}


def soak(k, tmp: str, *, n: int = 4, requests: int = 500, concurrency: int = 4, mode: str = "route") -> dict:
    """Run the loop in kernel ``k`` (TMPDIR ``tmp``) and ask for stacks ``requests`` times; the counts.

    ``mode``: ``route``, the control socket as the dashboard asks (each request waits for its answer);
    ``fifo``, a byte into each rank's request FIFO every millisecond per thread, without waiting for answers;
    ``signal``, the ranks register faulthandler on a signal and it is sent at that rate (before issue 28).
    """
    from jupyter_ext.run_files import RunDir
    from kernelside.launch.rank_stacks import ask_rank

    stop, count = os.path.join(tmp, "stop"), os.path.join(tmp, "steps")
    code = LOOP.format(n=n, stop=stop, count=count, prelude=OLD_PRELUDE if mode == "signal" else "")
    msg_id = k.kc.execute(code)
    from kernel import Cell

    cell = Cell()
    cell.msg_id = msg_id
    base = os.path.join(tmp, f"nblaunch-{os.getuid()}")
    deadline = time.monotonic() + 180
    found = None
    while found is None and time.monotonic() < deadline:
        found = _running_folder(base, n) if _steps(count) else None
        time.sleep(0.05)
    if found is None:
        raise RuntimeError("the loop's run never came up")
    folder, pids = found
    quiet_rate = _rate(count, 2.0)
    counts = {"full": 0, "partial": 0, "refused": 0, "sent": 0}
    seconds: list[float] = []
    reasons: dict[str, int] = {}
    lock = threading.Lock()
    crashed = threading.Event()

    def ask_new(d) -> None:
        t0 = time.monotonic()
        reply = d.request({"op": "stacks"}, 5.0, max_bytes=1 << 22)
        took = time.monotonic() - t0
        answered = sum(1 for r in reply.get("ranks", []) if r.get("answered"))
        with lock:
            seconds.append(took)
            for r in reply.get("ranks", []):
                if not r.get("answered"):
                    reasons[r.get("reason", "?")] = reasons.get(r.get("reason", "?"), 0) + 1
            counts["full" if answered == n else "partial" if reply.get("ok") else "refused"] += 1

    def ask_signal(_d) -> None:
        for pid in pids:
            os.kill(pid, OLD_SIGNAL)
        time.sleep(0.001)

    def ask_fifo(_d) -> None:
        for r in range(n):
            ask_rank(folder, f"rank{r}.stacks")
        time.sleep(0.001)

    ask = {"route": ask_new, "fifo": ask_fifo, "signal": ask_signal}[mode]

    def worker() -> None:
        with RunDir.open(folder) as d:
            while not crashed.is_set():
                with lock:
                    if counts["sent"] >= requests:
                        return
                    counts["sent"] += 1
                try:
                    ask(d)
                except Exception:  # noqa: BLE001 - a rank gone, the run ended: counted below
                    crashed.set()
                    return

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    t0 = time.monotonic()
    rate_box = {}
    for t in threads:
        t.start()
    rater = threading.Thread(target=lambda: rate_box.update(rate=_rate(count, 2.0)))
    rater.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    rater.join()
    open(stop, "w").close()
    k.wait(cell, timeout=180)
    os.unlink(stop)
    failed = cell.error is not None
    seconds.sort()
    return {
        "mode": MODES[mode],
        "waits": mode == "route",
        "requests": counts["sent"],
        "full": counts["full"],
        "partial": counts["partial"],
        "refused": counts["refused"],
        "crashed": failed,
        "error": "\n".join(cell.error["traceback"])[-600:] if failed else "",
        "elapsed_s": elapsed,
        "median_s": seconds[len(seconds) // 2] if seconds else None,
        "p99_s": seconds[int(len(seconds) * 0.99)] if seconds else None,
        "quiet_rate": quiet_rate,
        "asked_rate": rate_box.get("rate", 0.0),
        "steps": cell.stdout,
        "reasons": reasons,
    }


def _row(r: dict) -> str:
    lat = f"{r['median_s'] * 1000:.0f} / {r['p99_s'] * 1000:.0f}" if r["median_s"] is not None else "–"
    slow = f"{r['asked_rate'] / r['quiet_rate']:.2f}" if r["quiet_rate"] else "–"
    answers = f"{r['full']} | {r['partial']} | {r['refused']}" if r["waits"] else "– | – | –"
    return (
        f"| {r['mode']} | {r['requests']} | {answers} | "
        f"{'yes' if r['crashed'] else 'no'} | {r['elapsed_s']:.1f} | {lat} | {r['quiet_rate']:.0f} | "
        f"{r['asked_rate']:.0f} | {slow} |"
    )


def main() -> None:
    from bench.harness import adopt_orphans, heading, note, start_kernel, write_result

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="500 requests instead of 10,000")
    ap.add_argument("--requests", type=int, default=None)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("-n", type=int, default=4, help="ranks")
    ap.add_argument("--against", choices=("signal", "none"), default="signal")
    ap.add_argument("--hammer", type=int, default=None, help="asks per mode for fifo and signal (default 20,000)")
    a = ap.parse_args()
    requests = a.requests or (500 if a.quick else 10_000)
    adopt_orphans()
    rows = []
    hammer = a.hammer or (2_000 if a.quick else 20_000)
    plan = [("route", requests), ("fifo", hammer)] + ([("signal", hammer)] if a.against == "signal" else [])
    for mode, count in plan:
        tmp = tempfile.mkdtemp(prefix="nblaunch-stacks-soak-")
        k = start_kernel(cwd=tmp, env={"TMPDIR": tmp})
        try:
            k.run("%load_ext kernelside", timeout=120).ok()
            r = soak(k, tmp, n=a.n, requests=count, concurrency=a.concurrency, mode=mode)
        finally:
            k.shutdown()
        note(f"{r['mode']}: {r['requests']} requests, crashed: {r['crashed']} {r['error'][-200:]}")
        rows.append(r)
    how = f"python -m bench.stacks_soak{' --quick' if a.quick else ''} --against {a.against}"
    text = heading("Stacks under load: requests at once against a gloo all_reduce loop", "stacks_soak", a.quick, how)
    text += (
        f"\n{a.n} ranks, {a.concurrency} threads asking at once: {requests} requests through the kernel, each waiting "
        f"for its answer; {hammer} asks of every rank directly, 1 ms apart per thread, without waiting (the old way's "
        "signal, and now the request FIFO; a run stops at its first crash). Requests that found every rank answering, "
        "some, or were refused; the loop's steps per second before and while asked."
        "\n\n| way | requests | every rank answered | some ranks | refused | a rank crashed | seconds | "
        "ms per request (median / p99) | steps/s quiet | steps/s asked | ratio |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|\n" + "\n".join(_row(r) for r in rows) + "\n"
    )
    for r in rows:
        if r["reasons"]:
            text += (
                f"\n{r['mode']}, why a rank was missing from an answer: "
                + "; ".join(f"{n} x {why}" for why, n in sorted(r["reasons"].items(), key=lambda kv: -kv[1])[:5])
                + "\n"
            )
        if r["crashed"]:
            text += f"\n{r['mode']}, the cell's error (its end):\n\n```\n{r['error']}\n```\n"
    print(write_result("stacks_soak", a.quick, text))


if __name__ == "__main__":
    main()
