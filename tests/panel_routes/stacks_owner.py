"""A stand-in kernel for the stacks route test: one real 2-rank launch in which rank 1 waits in
``barrier()`` (blocked in gloo's C code) while rank 0 waits in Python for ``release`` to appear
in the working directory, then joins the barrier.

    python stacks_owner.py
"""

from __future__ import annotations

from kernelside import notebook_launcher


def wait_for_release():
    import os
    import time

    while not os.path.exists("release"):
        time.sleep(0.01)


def stuck_in_barrier():
    import torch.distributed as dist

    dist.barrier()


def ranks():
    import torch.distributed as dist

    print(f"rank {dist.get_rank()} in place", flush=True)
    if dist.get_rank() == 0:
        wait_for_release()
    stuck_in_barrier()
    return dist.get_rank()


if __name__ == "__main__":
    notebook_launcher(ranks, num_processes=2, timeout=120)
    print("DONE", flush=True)
