"""pytest-jupyter's server fixtures, for the route tests in this folder only.

They are imported here rather than enabled for the whole suite because some are autouse
(a fresh event loop and ServerApp cleanup around every test), which the kernel-side
tests do not want. ``run_base`` is the route tests' own: the server's default run folder base.
"""

import os
import tempfile
from pathlib import Path

import pytest
from pytest_jupyter.jupyter_server import *  # noqa: F403
from traitlets.config import Config

from kernelside import config


@pytest.fixture
def jp_server_config():
    return Config({"ServerApp": {"jpserver_extensions": {"jupyter_ext": True}}})


@pytest.fixture(autouse=True)
def no_config_outside_root(tmp_path, monkeypatch):
    """No $NBLAUNCH_CONFIG and no Accelerate default config may leak into these tests."""
    monkeypatch.delenv(config.ENV_CONFIG, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))


@pytest.fixture
def run_base(tmp_path, monkeypatch) -> Path:
    """The server's default run folder base, under this test's own temp dir."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    base = tmp / f"nblaunch-{os.getuid()}"
    base.mkdir()
    return base
