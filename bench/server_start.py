"""What nblaunch's server extension costs a JupyterLab start: a real ``jupyter server`` on 127.0.0.1
started with the extension and without it, interleaved, timed from ``Popen`` to the first answer of
``/api/status`` (the extensions load before the server listens, so their import is inside the time).

    python -m bench.server_start                       # this checkout, 3 starts of each
    python -m bench.server_start --source /tmp/old --source .   # two checkouts (each one's code first on
                                                                # sys.path), interleaved in one run

After each start with the extension it also asks ``/nblaunch/config``, ``/nblaunch/runs`` and
``/nblaunch/hardware`` and reads the server's ``/proc/PID/maps``: the table says whether libtorch was
mapped. Every server is stopped by its pid (SIGTERM, then SIGKILL of the session it leads).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

from bench.harness import REPO, JupyterServer, machine, note, write_result


def _cpu_seconds(pid: int) -> float:
    """CPU time (user + system) the process has used: unlike wall time, other users' load barely moves it."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _maps_torch(pid: int) -> bool:
    with open(f"/proc/{pid}/maps") as fh:
        return "libtorch" in fh.read()


def start_once(source: str, with_extension: bool) -> tuple[float, float, bool | None]:
    """Seconds until ``/api/status`` answers, the server's CPU seconds by then, and (with the extension)
    whether libtorch got mapped after the three routes."""
    with JupyterServer(with_extension=with_extension, source=source) as server:
        elapsed = server.wait_ready("/api/status")
        cpu = _cpu_seconds(server.process.pid)
        torch_mapped = None
        if with_extension:
            for route in ("config", "runs", "hardware"):
                server.get(f"/nblaunch/{route}")
            torch_mapped = _maps_torch(server.process.pid)
        return elapsed, cpu, torch_mapped


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", action="append", help="a checkout whose jupyter_ext and kernelside are measured")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="one start of each")
    ns = ap.parse_args()
    sources = [os.path.abspath(p) for p in ns.source or [REPO]]
    repeat = 1 if ns.quick else ns.repeat
    times = {(src, ext): [] for src in sources for ext in (True, False)}
    cpus = {key: [] for key in times}
    mapped: dict[str, list[bool]] = {src: [] for src in sources}
    start_once(sources[0], False)  # warm the page cache: the first start of a day is not the question
    for i in range(repeat):
        order = list(times)
        order = order[i % len(order) :] + order[: i % len(order)]  # interleaved, rotating which goes first
        for src, with_ext in order:
            elapsed, cpu, torch_mapped = start_once(src, with_ext)
            times[(src, with_ext)].append(elapsed)
            cpus[(src, with_ext)].append(cpu)
            if torch_mapped is not None:
                mapped[src].append(torch_mapped)
            note(f"{src} {'with' if with_ext else 'without'} the extension: {elapsed:.2f} s, CPU {cpu:.2f} s")
    lines = [
        f"# jupyter server start-up, with and without nblaunch's extension ({machine('CPU')})",
        f"command: python -m bench.server_start {' '.join(sys.argv[1:])}; until /api/status answers, "
        f"median of {repeat} starts each, interleaved",
        "",
        "| code | without the extension (s) | with it (s) | ratio | server CPU s without / with (ratio) "
        "| libtorch mapped after the 3 routes |",
        "|---|---|---|---|---|---|",
    ]
    for src in sources:
        head = subprocess.run(["git", "-C", src, "log", "-1", "--format=%h %s"], capture_output=True, text=True)
        without_s, with_s = statistics.median(times[(src, False)]), statistics.median(times[(src, True)])
        each = [", ".join(f"{t:.2f}" for t in times[(src, ext)]) for ext in (False, True)]
        starts = " / ".join(each)
        cpu_without, cpu_with = statistics.median(cpus[(src, False)]), statistics.median(cpus[(src, True)])
        lines.append(
            f"| {src} ({head.stdout.strip()[:60] or 'not a git checkout'}) | {without_s:.2f} | {with_s:.2f} | "
            f"{with_s / without_s:.2f}x | {cpu_without:.2f} / {cpu_with:.2f} ({cpu_with / cpu_without:.2f}x) | "
            f"{'yes' if any(mapped[src]) else 'no'} |"
        )
        lines.append(f"| (each start, without / with) | {starts} | | | | |")
    write_result("server_start", ns.quick, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
