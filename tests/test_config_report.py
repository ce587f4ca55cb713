"""What %distributed_config prints, without a kernel: what differs from the defaults first, with where it came
from, then invalid values marked, then the defaults and the plan."""

from __future__ import annotations

import pytest

from kernelside.config import resolve_config
from kernelside.notebook.config_report import config_report


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    monkeypatch.delenv("NBLAUNCH_CONFIG", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))


def test_what_differs_from_the_defaults_comes_first_with_its_source(tmp_path):
    path = tmp_path / "nblaunch.yaml"
    path.write_text("mixed_precision: bf16\nnum_processes: 3\n")
    text = config_report(resolve_config({"output": "all"}, cwd=tmp_path, lenient=True))
    lines = text.splitlines()
    changed, defaults = lines.index("changed from the defaults:"), lines.index("defaults:")
    first = lines[changed + 1 : defaults]
    assert [ln.split()[0] for ln in first] == ["num_processes", "mixed_precision", "output"]
    assert first[0].endswith(f"from {path}") and first[2].endswith("from argument")
    rows = [ln for ln in lines[defaults + 1 :] if ln.startswith("  ") and "warning" not in ln]
    assert rows and all(ln.endswith("from default") for ln in rows)
    assert "plan: 3 processes" in text


def test_nothing_changed_says_so(tmp_path):
    text = config_report(resolve_config({}, cwd=tmp_path, lenient=True))
    assert "changed from the defaults: nothing" in text


def test_an_invalid_value_in_the_file_is_marked_and_the_plan_says_why_not(tmp_path):
    path = tmp_path / "nblaunch.yaml"
    path.write_text("timeout: -3\nbackend: gloo\n")
    text = config_report(resolve_config({}, cwd=tmp_path, lenient=True))
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("timeout"))
    assert "-3" in line and "invalid, allowed: a number > 0 or empty" in line
    assert f"plan: not possible: invalid timeout=-3 (in {path})" in text
