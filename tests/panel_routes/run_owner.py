"""A stand-in for a notebook's kernel in the route tests: a separate process that runs one real
2-rank launch, so the server extension under test is a different process than the run's owner.

    python run_owner.py STEPS PAUSE_S     # each rank prints "rank R line I" STEPS times

It prints ``STOPPED: <message>`` and exits 3 if the run was stopped from the panel.
"""

from __future__ import annotations

import sys

from kernelside import LaunchStoppedError, notebook_launcher


def lines(steps: int, pause: float):
    import time

    import torch.distributed as dist

    for i in range(steps):
        print(f"rank {dist.get_rank()} line {i}", flush=True)
        time.sleep(pause)
    return dist.get_rank()


if __name__ == "__main__":
    try:
        notebook_launcher(lines, args=(int(sys.argv[1]), float(sys.argv[2])), num_processes=2, timeout=120)
    except LaunchStoppedError as e:
        print(f"STOPPED: {type(e).__name__}: {e}", flush=True)
        sys.exit(3)
    print("DONE", flush=True)
