"""What keeping ``state.json`` costs the kernel loop (issue 14): one turn of the loop when nothing
changed (a compare of a few fields), and one write of an 8-rank run's state (snapshot, JSON,
temporary file, rename). The ranks do nothing for it.

    python -m bench.run_state_cost

Prints both figures (medians of 5 rounds).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
import timeit

from kernelside.launch.report import LaunchReport, RankReport
from kernelside.launch.run_state import RunStateWriter


def main() -> None:
    run_dir = tempfile.mkdtemp(prefix="run-20250101-000000-", dir=tempfile.mkdtemp(prefix="nblaunch-bench-"))
    report = LaunchReport(
        world_size=8, backend="gloo", start_method="fork", port=0, log_dir=run_dir, started_at=time.time()
    )
    report.ranks = [
        RankReport(rank=r, pid=os.getpid(), log_path=os.path.join(run_dir, f"rank{r}.log"), ready_s=0.1)
        for r in range(8)
    ]
    writer = RunStateWriter(run_dir, engine="local")
    writer.update(report)
    ticks, writes = [], []
    for _ in range(5):
        writer.last_write = time.monotonic()  # nothing changed and the last write was just now
        ticks.append(timeit.timeit(lambda: writer.update(report), number=100_000) / 100_000)
        writes.append(timeit.timeit(lambda: writer.update(report, final=True), number=1000) / 1000)
    size = os.path.getsize(os.path.join(run_dir, "state.json"))
    print(f"loop turn, nothing changed: {statistics.median(ticks) * 1e9:.0f} ns")
    print(f"one write of an 8-rank state ({size} bytes): {statistics.median(writes) * 1e6:.0f} us")
    print(f"at 4 writes a second: {4 * statistics.median(writes) * 100:.3f} % of one core")


if __name__ == "__main__":
    main()
