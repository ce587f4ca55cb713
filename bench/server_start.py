"""What nblaunch's server extension costs a JupyterLab start: a real ``jupyter server`` on 127.0.0.1
started with the extension and without it, interleaved, timed from ``Popen`` to the first answer of
``/api/status`` (the extensions load before the server listens, so their import is inside the time).

    python -m bench.server_start                       # this checkout, 3 starts of each
    python -m bench.server_start --source /tmp/old     # another checkout of the repo (its code first on sys.path)

After each start with the extension it also asks ``/nblaunch/config``, ``/nblaunch/runs`` and
``/nblaunch/hardware`` and reads the server's ``/proc/PID/maps``: the table says whether libtorch was
mapped. Every server is stopped by its pid (SIGTERM, then SIGKILL of the session it leads).
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

from bench.harness import REPO, free_port, machine, note, write_result


def _get(url: str, token: str, timeout: float = 60):
    request = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def _maps_torch(pid: int) -> bool:
    with open(f"/proc/{pid}/maps") as fh:
        return "libtorch" in fh.read()


def start_once(source: str, with_extension: bool) -> tuple[float, bool | None]:
    """Seconds until ``/api/status`` answers, and (with the extension) whether libtorch got mapped."""
    root = tempfile.mkdtemp(prefix="nblaunch-bench-start-")
    port, token = free_port(), secrets.token_hex(16)
    env = {**os.environ, "PYTHONPATH": source + os.pathsep + os.environ.get("PYTHONPATH", "")}
    flag = "True" if with_extension else "False"
    t0 = time.monotonic()
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyter_server", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         "--port-retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
         f"--ServerApp.jpserver_extensions={{'jupyter_ext': {flag}}}", "--allow-root"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env=env, cwd=root,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = t0 + 120
        while True:
            try:
                _get(f"{base}/api/status", token, timeout=5)
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit("jupyter server did not start") from None
                time.sleep(0.02)
        elapsed = time.monotonic() - t0
        torch_mapped = None
        if with_extension:
            for route in ("config", "runs", "hardware"):
                _get(f"{base}/nblaunch/{route}", token)
            torch_mapped = _maps_torch(server.pid)
        return elapsed, torch_mapped
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)  # the session this script started, by its id
            server.wait(10)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", default=REPO, help="the checkout whose jupyter_ext and kernelside are measured")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="one start of each")
    ns = ap.parse_args()
    repeat = 1 if ns.quick else ns.repeat
    times: dict[bool, list[float]] = {True: [], False: []}
    mapped = []
    start_once(ns.source, False)  # warm the page cache for both: the first start of a day is not the question
    for i in range(repeat):
        for with_ext in (i % 2 == 0, i % 2 != 0):  # interleaved, alternating which goes first
            elapsed, torch_mapped = start_once(ns.source, with_ext)
            times[with_ext].append(elapsed)
            if torch_mapped is not None:
                mapped.append(torch_mapped)
            note(f"{'with' if with_ext else 'without'} the extension: {elapsed:.2f} s")
    with_s, without_s = statistics.median(times[True]), statistics.median(times[False])
    commit = subprocess.run(["git", "-C", ns.source, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    text = "\n".join(
        [
            f"# jupyter server start-up, with and without nblaunch's extension ({machine('CPU')})",
            f"source: {ns.source} (commit {commit.stdout.strip() or 'not a git checkout'}); "
            f"command: python -m bench.server_start {' '.join(sys.argv[1:])}",
            "",
            "| server | median of starts (s) | starts (s) |",
            "|---|---|---|",
            f"| without the extension | {without_s:.2f} | {', '.join(f'{t:.2f}' for t in times[False])} |",
            f"| with the extension | {with_s:.2f} | {', '.join(f'{t:.2f}' for t in times[True])} |",
            "",
            f"ratio with/without: {with_s / without_s:.2f}x; libtorch mapped in the server after the three "
            f"routes: {'yes' if any(mapped) else 'no'}",
            "",
        ]
    )
    write_result("server_start" + ("-before" if ns.source != REPO else ""), ns.quick, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
