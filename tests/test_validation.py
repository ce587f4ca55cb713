"""Every value validated once, everywhere: for each field of the schema, invalid values derived from the schema
itself are refused at every entry point (nblaunch.yaml, the panel's save and import, notebook_launcher(), live
start(), an Accelerate config, the magics' flags), naming the key, the value, where it came from and what is
allowed, before anything starts."""

from __future__ import annotations

import os

import pytest
import yaml
from harness import children

import kernelside
from jupyter_ext.config_store import ConfigStore
from jupyter_ext.errors import PanelRequestError
from kernelside import config, notebook_launcher
from kernelside.config.field_checks import allowed
from kernelside.errors import LaunchConfigError


def invalid_values(f: config.Field) -> list:
    """Values the schema must refuse for ``f``, from its type, range, choices and shape: no list to keep in step."""
    if f.type == "int":
        out = ["abc", 1.5, True]
        out += [f.minimum - 1] if f.minimum is not None else []
        out += [f.maximum + 1] if f.maximum is not None else []
        return out
    if f.type == "float":
        out = ["soon", "nan", float("inf")]
        out += [f.minimum] if f.minimum is not None and f.above_minimum else []
        out += [f.minimum - 1] if f.minimum is not None else []
        return out
    if f.type == "bool":
        return ["maybe", 2]
    if f.type == "list":
        return ["text", {"a": 1}]
    if f.type == "dict":
        return [[1, 2], "text"] + ([{"A=B": "1"}] if f.name == "env" else [])
    if f.choices:
        return ["nonsense", 3]
    shapes = {
        "gpu_ids": ["first", "0;1"],
        "main_process_ip": ["host:29500", "two words"],
        "ray_address": ["somewhere"],
        "log_dir": ["", "   "],
    }
    return [{"a": 1}, *shapes.get(f.name, [])]


CASES = [(f.name, v) for f in config.FIELDS for v in invalid_values(f)]


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    monkeypatch.delenv("NBLAUNCH_CONFIG", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))


def test_every_field_has_invalid_values_and_words_for_what_is_allowed():
    assert {name for name, _ in CASES} == set(config.FIELDS_BY_NAME)
    assert allowed("main_process_port") == "an integer from 1 to 65535 or empty"
    assert allowed("timeout") == "a number > 0 or empty"


@pytest.mark.parametrize("key, value", CASES)
def test_the_schema_refuses_it_naming_key_value_and_what_is_allowed(key, value):
    with pytest.raises(LaunchConfigError) as info:
        config.check_value(key, value)
    assert info.value.key == key
    assert f"invalid {key}={value!r}" in str(info.value) and "allowed is " in str(info.value)


@pytest.mark.parametrize("key, value", CASES)
def test_nblaunch_yaml_refuses_it_naming_the_file(tmp_path, key, value):
    path = tmp_path / "nblaunch.yaml"
    path.write_text(yaml.safe_dump({key: value}))
    read_back = yaml.safe_load(path.read_text())[key]
    with pytest.raises(LaunchConfigError) as info:
        config.resolve_config({}, cwd=tmp_path)
    assert str(info.value).startswith(f"invalid {key}={read_back!r} (in {path}): allowed is ")


@pytest.mark.parametrize("key, value", CASES)
def test_the_panel_save_refuses_it_on_its_field_and_leaves_the_file(tmp_path, key, value):
    root = tmp_path / "root"
    root.mkdir()
    with pytest.raises(PanelRequestError) as info:
        ConfigStore(root).save({"values": {key: value}})
    assert info.value.status == 400 and set(info.value.fields) == {key}
    assert not (root / "nblaunch.yaml").exists()


ACCELERATE_CASES = [(k, v) for k, v in CASES if config.FIELDS_BY_NAME[k].accelerate]


@pytest.mark.parametrize("key, value", ACCELERATE_CASES)
def test_an_accelerate_config_with_it_is_refused_by_a_launch_and_by_the_panel_import(tmp_path, key, value):
    acc = tmp_path / "hf" / "accelerate" / "default_config.yaml"
    acc.parent.mkdir(parents=True)
    acc.write_text(yaml.safe_dump({"distributed_type": "MULTI_CPU", key: value}))
    with pytest.raises(LaunchConfigError) as info:
        config.resolve_config({}, cwd=tmp_path)
    assert info.value.key == key and f"(in {acc})" in str(info.value)
    root = tmp_path / "root"
    root.mkdir()
    (root / "acc.yaml").write_text(acc.read_text())
    with pytest.raises(PanelRequestError) as refused:
        ConfigStore(root).import_accelerate({"path": "acc.yaml"})
    assert set(refused.value.fields) == {key} and key in refused.value.message
    shown = ConfigStore(root).read()  # the default config read as a fallback marks the field
    assert set(shown["field_errors"]) == {key}


# notebook_launcher's own spelling of a key (Accelerate's use_port) and the keys it takes.
LAUNCHER_KEYS = {
    "num_processes": "num_processes",
    "mixed_precision": "mixed_precision",
    "main_process_port": "use_port",
    "backend": "backend",
    "start_method": "start_method",
    "gpu_ids": "gpu_ids",
    "output": "output",
    "timeout": "timeout",
    "engine": "engine",
    "metrics": "metrics",
}
LAUNCHER_CASES = [(k, v) for k, v in CASES if k in LAUNCHER_KEYS and not (k == "main_process_port" and v == 0)]


@pytest.mark.parametrize("key, value", LAUNCHER_CASES)
def test_notebook_launcher_refuses_it_before_anything_starts(tmp_path, key, value):
    marker = tmp_path / "ran"

    def train():
        marker.touch()

    spelled = LAUNCHER_KEYS[key]
    with pytest.raises(LaunchConfigError) as info:
        notebook_launcher(train, **{spelled: value})
    assert info.value.key == key
    assert f"(from notebook_launcher({spelled}=...))" in str(info.value)
    assert not marker.exists()


def test_live_start_refuses_a_port_out_of_range_naming_it():
    with pytest.raises(LaunchConfigError, match=r"main_process_port=70000 \(from start\(port=\.\.\.\)\)"):
        kernelside.start(num_processes=2, port=70000)


FLAG_CASES = [
    ("--port 70000", "main_process_port=70000 (from the flag --port): allowed is an integer from 1 to 65535"),
    ("-n 0", "num_processes=0 (from the flag --num-processes)"),
    ("--timeout 0", "timeout=0.0 (from the flag --timeout): allowed is a number > 0"),
    ("--timeout nan", "timeout=nan (from the flag --timeout)"),
    ("--gpu-ids first", "gpu_ids='first' (from the flag --gpu-ids)"),
    ("--output some", "output='some' (from the flag --output)"),
    ("--engine slurm", "engine='slurm' (from the flag --engine)"),
]


@pytest.mark.parametrize("flags, fragment", FLAG_CASES)
def test_a_bad_flag_value_starts_nothing_and_names_the_flag(kernel, tmp_path, flags, fragment):
    marker = tmp_path / "ran"
    before = children(kernel.pid)
    cell = kernel.run(f"%%distributed -n 2 {flags}\nopen({str(marker)!r}, 'w').close()\n")
    assert cell.error["ename"] == "LaunchConfigError"
    assert fragment in cell.error["evalue"] and "Nothing was started." in cell.error["evalue"]
    assert not marker.exists() and children(kernel.pid) <= before
    assert "engines/local.py" not in "".join(cell.error["traceback"])


def test_distributed_config_marks_an_invalid_value_in_the_file(tmp_path, new_kernel):
    (tmp_path / "nblaunch.yaml").write_text("num_processes: 3\nmain_process_port: 70000\n")
    k = new_kernel(cwd=str(tmp_path), env={"HF_HOME": str(tmp_path / "hf")})
    out = k.run("%distributed_config").ok().stdout
    line = next(ln for ln in out.splitlines() if "main_process_port" in ln)
    assert "70000" in line and "invalid" in line and "1 to 65535" in line
    assert "plan: not possible" in out


def test_saving_a_valid_port_range_edge_from_the_panel_is_read_back_by_a_launch(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    ConfigStore(root).save({"values": {"main_process_port": 65535, "timeout": 0.5}})
    cfg = config.resolve_config({}, cwd=root)
    assert (cfg["main_process_port"], cfg["timeout"]) == (65535, 0.5)
    assert cfg.sources["main_process_port"] == os.path.join(root, "nblaunch.yaml")
