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
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

from bench.harness import free_port


def _get(url: str, token: str):
    request = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--interval", type=float, default=1.0, help="the panel polls once a second while a run is live")
    ns = ap.parse_args()
    stop = {"now": False}
    signal.signal(signal.SIGINT, lambda *_: stop.update(now=True))
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    root = tempfile.mkdtemp(prefix="nblaunch-bench-panel-")
    port, token = free_port(), secrets.token_hex(16)
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyter_server", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         "--port-retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
         "--ServerApp.jpserver_extensions={'jupyter_ext': True}", "--allow-root"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}/nblaunch/runs"
    latencies, polls, details, live_polls = [], 0, 0, 0
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                _get(base, token)
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit("jupyter server did not start") from None
                time.sleep(0.2)
        end = time.monotonic() + ns.seconds
        next_poll = time.monotonic()
        while not stop["now"] and time.monotonic() < end:
            t0 = time.perf_counter()
            runs = _get(base, token)
            latencies.append(time.perf_counter() - t0)
            live = [r["id"] for r in runs if r["live"]]
            for run_id in live:  # the panel fetches the detail of the runs it shows expanded
                t0 = time.perf_counter()
                _get(f"{base}/{run_id}", token)
                latencies.append(time.perf_counter() - t0)
                details += 1
            polls += 1
            live_polls += bool(live)
            next_poll += ns.interval
            time.sleep(max(0.0, next_poll - time.monotonic()))
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)  # the session this script started, by its id
            server.wait(10)
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
