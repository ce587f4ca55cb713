"""A stand-in for a notebook kernel with a live session, for the route tests: it starts a 2-rank session,
prints ``UP``, then waits on stdin with nothing running in its main thread (as a kernel between cells).

    python live_owner.py      # at EOF on stdin it stops the session (if Stop has not) and exits
"""

from __future__ import annotations

import sys

from kernelside.live.session import LiveSession

if __name__ == "__main__":
    session = LiveSession.start({"num_processes": 2})
    print("UP", flush=True)
    sys.stdin.read()
    session.stop()
    print("DONE", flush=True)
