"""A rank's side of JupyterLab's debugger: a kernel end that never configures the rank's debugpy (it closes
the connection, or says nothing) leaves the rank running undebugged after a bounded wait, with one line."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading

import pytest
from kernel import REPO

pytestmark = pytest.mark.processes  # starts a Python process

RANK = """
import sys, time
sys.path.insert(0, {repo!r})
from kernelside.debugger import rank_side
t = time.monotonic()
ok = rank_side.connect("127.0.0.1:{port}:secret", rank=1, wait_s=3)
print("connected" if ok else "undebugged", round(time.monotonic() - t), rank_side.debugged(), flush=True)
"""


@pytest.mark.parametrize("kernel_end", ["closes", "says nothing"])
def test_a_rank_whose_kernel_never_configures_it_runs_on_undebugged(kernel_end):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    held = []

    def accept():
        conn, _ = listener.accept()
        if kernel_end == "closes":
            conn.close()
        else:
            held.append(conn)

    threading.Thread(target=accept, daemon=True).start()
    try:
        done = subprocess.run(
            [sys.executable, "-c", RANK.format(repo=REPO, port=listener.getsockname()[1])],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        listener.close()
        for conn in held:
            conn.close()
    assert done.stdout.split()[:1] == ["undebugged"], done.stdout + done.stderr
    assert done.stdout.split()[2] == "False"
    assert "runs without JupyterLab's debugger" in done.stderr and "in 3s" in done.stderr, done.stderr
