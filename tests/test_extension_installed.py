"""After set-up (`make lab` / `make test`), JupyterLab lists nblaunch's extensions as enabled and OK."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from jupyter_ext.version_check import served_labextension_version
from kernelside.versions import installed_version

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

JUPYTER = os.path.join(os.path.dirname(sys.executable), "jupyter")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _listing(*args: str) -> str:
    proc = subprocess.run([JUPYTER, *args], capture_output=True, text=True, timeout=120)
    return ANSI.sub("", proc.stdout + proc.stderr)


pytestmark = pytest.mark.processes  # every test here asks the jupyter command


def test_labextension_list_shows_nblaunch_enabled_and_ok():
    assert re.search(rf"nblaunch v{re.escape(installed_version())} enabled OK", _listing("labextension", "list"))


def test_the_three_parts_name_one_version_pyproject_and_package_json_agree():
    with open(os.path.join(REPO, "package.json"), encoding="utf-8") as f:
        package = json.load(f)["version"]
    assert installed_version() == served_labextension_version() == package  # kernelside, the served labextension


def test_server_extension_list_shows_the_nblaunch_server_extension_enabled_and_ok():
    out = _listing("server", "extension", "list")
    assert "jupyter_ext enabled" in out
    assert re.search(rf"jupyter_ext\s+{re.escape(installed_version())}\s+OK", out)  # with its version
