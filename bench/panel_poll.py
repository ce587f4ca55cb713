"""The Runs view's load on a machine, without a browser: a real ``jupyter server`` with nblaunch's
extension on 127.0.0.1, polled as an open panel polls it while a run is live (the list and the
detail of every live run, once a second), for as long as this script runs.

    python -m bench.panel_poll --seconds 900 &     # then run a benchmark, e.g. python -m bench.steady
    kill -INT <its pid>                              # stops the server (by pid) and prints the figures

Used to measure ``bench.steady`` with the panel open (issue 14): start this first, run the
benchmark, stop this. Prints one JSON line: polls, requests, median and 95th percentile latency.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import time

from bench.harness import JupyterServer


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--interval", type=float, default=1.0, help="the panel polls once a second while a run is live")
    ns = ap.parse_args()
    stop = {"now": False}
    signal.signal(signal.SIGINT, lambda *_: stop.update(now=True))
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    server = JupyterServer()
    base = "/nblaunch/runs"
    latencies, polls, details, live_polls = [], 0, 0, 0
    try:
        server.wait_ready(base, timeout=60, every=0.2)
        end = time.monotonic() + ns.seconds
        next_poll = time.monotonic()
        while not stop["now"] and time.monotonic() < end:
            t0 = time.perf_counter()
            runs = server.get(base, timeout=10)
            latencies.append(time.perf_counter() - t0)
            live = [r["id"] for r in runs if r["live"]]
            for run_id in live:  # the panel fetches the detail of the runs it shows expanded
                t0 = time.perf_counter()
                server.get(f"{base}/{run_id}", timeout=10)
                latencies.append(time.perf_counter() - t0)
                details += 1
            polls += 1
            live_polls += bool(live)
            next_poll += ns.interval
            time.sleep(max(0.0, next_poll - time.monotonic()))
    finally:
        server.stop()
    q = statistics.quantiles(latencies, n=20) if len(latencies) >= 20 else [float("nan")] * 19
    print(
        json.dumps(
            {
                "polls": polls,
                "polls_with_a_live_run": live_polls,
                "detail_requests": details,
                "median_ms": round(statistics.median(latencies) * 1e3, 2) if latencies else None,
                "p95_ms": round(q[18] * 1e3, 2),
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
