"""A second local user for the shared-machine tests, made and removed by them (as root), and running as it.

>>> def test_x(other_user):                      # doctest: +SKIP
...     as_user(other_user, "cat", "/tmp/nblaunch-0/run-x/rank0.log").returncode   # 1: Permission denied
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import subprocess

import pytest


@pytest.fixture(scope="module")
def other_user():
    """A second local user for the test module, removed at its end (skipped, with the reason, where none can be
    made)."""
    if os.geteuid() != 0:
        pytest.skip("making a second local user needs root; this test runs as an ordinary user")
    if shutil.which("useradd") is None or shutil.which("userdel") is None:
        pytest.skip("useradd/userdel are not installed: no second local user can be made")
    name = f"nbl28{secrets.token_hex(3)}"
    made = subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
        capture_output=True,
        text=True,
    )
    if made.returncode != 0:
        pytest.skip(f"useradd {name} failed: {made.stderr.strip()}")
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], capture_output=True)


def as_user(user, *argv) -> subprocess.CompletedProcess:
    """Run ``argv`` as ``user`` (its own uid and gid only)."""
    return subprocess.run(
        list(argv), user=user.pw_uid, group=user.pw_gid, extra_groups=[], capture_output=True, text=True, timeout=30
    )
