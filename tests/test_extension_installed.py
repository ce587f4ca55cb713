"""After set-up (`make lab` / `make test`), JupyterLab lists nblaunch's extensions as enabled and OK."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

JUPYTER = os.path.join(os.path.dirname(sys.executable), "jupyter")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _listing(*args: str) -> str:
    proc = subprocess.run([JUPYTER, *args], capture_output=True, text=True, timeout=120)
    return ANSI.sub("", proc.stdout + proc.stderr)


pytestmark = pytest.mark.processes  # every test here asks the jupyter command


def test_labextension_list_shows_nblaunch_enabled_and_ok():
    assert re.search(r"nblaunch v[\d.]+ enabled OK", _listing("labextension", "list"))


def test_server_extension_list_shows_the_nblaunch_server_extension_enabled_and_ok():
    out = _listing("server", "extension", "list")
    assert "jupyter_ext enabled" in out
    assert re.search(r"jupyter_ext\s+OK", out)
