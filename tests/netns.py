"""Run a command in its own network namespace that has only a loopback interface.

torch's elastic agent and Ray open some listening sockets on every interface; inside this
namespace every interface is loopback, so nothing a test starts can be reached from (or
talk to) anything but this machine's 127.0.0.1.
"""

from __future__ import annotations

import os
import signal
import subprocess

UNSHARE = "/usr/bin/unshare"
IP = "/usr/sbin/ip" if os.path.exists("/usr/sbin/ip") else "/sbin/ip"


def loopback_only(argv: list[str]) -> list[str]:
    """``argv`` prefixed so that it runs in a fresh network namespace with ``lo`` up."""
    return [UNSHARE, "--net", "--", "sh", "-c", f'{IP} link set lo up && exec "$@"', "netns", *argv]


def run_isolated(argv: list[str], *, timeout: float, env: dict | None = None, cwd=None) -> subprocess.CompletedProcess:
    """Run ``argv`` loopback-only; on timeout its whole process group is killed, then TimeoutError."""
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", **(env or {})}
    proc = subprocess.Popen(
        loopback_only(argv),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=cwd,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise TimeoutError(f"{argv} did not finish in {timeout}s\nstdout:\n{out}\nstderr:\n{err[-4000:]}") from None
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)
