"""nblaunch.yaml: lookup order, validation messages, parse errors, unknown keys, atomic saves."""

from __future__ import annotations

import os

import pytest

from kernelside import notebook_launcher
from kernelside.config import (
    find_config_path,
    load_config_file,
    resolve_config,
    save_config_file,
)
from kernelside.config.accelerate import import_accelerate
from kernelside.errors import LaunchConfigError


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    monkeypatch.delenv("NBLAUNCH_CONFIG", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))


def test_lookup_order_explicit_then_env_then_walk_up_then_accelerate(tmp_path, monkeypatch):
    project = tmp_path / "project"
    deep = project / "notebooks" / "exp"
    deep.mkdir(parents=True)
    assert find_config_path(deep) == (None, "none")
    acc = tmp_path / "hf" / "accelerate" / "default_config.yaml"
    acc.parent.mkdir(parents=True)
    acc.write_text("num_processes: 4\nmixed_precision: fp16\ndistributed_type: MULTI_GPU\n")
    assert find_config_path(deep) == (acc, "accelerate")
    (project / "nblaunch.yaml").write_text("num_processes: 3\n")
    assert find_config_path(deep) == (project / "nblaunch.yaml", "nblaunch.yaml")
    env_file = tmp_path / "env.yaml"
    env_file.write_text("num_processes: 5\n")
    monkeypatch.setenv("NBLAUNCH_CONFIG", str(env_file))
    assert find_config_path(deep) == (env_file, "NBLAUNCH_CONFIG")
    assert find_config_path(deep, explicit="x.yaml")[1] == "explicit"


def test_arguments_override_the_file_and_sources_say_so(tmp_path):
    (tmp_path / "nblaunch.yaml").write_text("num_processes: 3\nmixed_precision: bf16\n")
    cfg = resolve_config({"num_processes": 2}, cwd=tmp_path)
    assert cfg["num_processes"] == 2 and cfg.sources["num_processes"] == "argument"
    assert cfg["mixed_precision"] == "bf16" and cfg.sources["mixed_precision"] == str(tmp_path / "nblaunch.yaml")
    assert cfg.sources["output"] == "default"


def test_accelerate_default_config_supplies_overlapping_keys(tmp_path):
    acc = tmp_path / "hf" / "accelerate" / "default_config.yaml"
    acc.parent.mkdir(parents=True)
    acc.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_CPU\nnum_processes: 3\n"
        "mixed_precision: bf16\nuse_cpu: true\nmain_training_function: main\n"
    )
    cfg = resolve_config({}, cwd=tmp_path)
    assert (cfg["num_processes"], cfg["mixed_precision"], cfg["use_cpu"]) == (3, "bf16", True)
    assert cfg.warnings == []


def test_invalid_value_in_file_names_key_value_file_and_what_is_allowed(tmp_path):
    path = tmp_path / "nblaunch.yaml"
    path.write_text("backend: mpi\n")
    with pytest.raises(LaunchConfigError) as info:
        resolve_config({}, cwd=tmp_path)
    assert str(info.value) == (
        f"invalid backend='mpi' (in {path}): allowed is one of 'auto', 'nccl', 'gloo'. Nothing was started."
    )


def test_unparsable_file_reports_the_line_and_launch_starts_nothing(tmp_path):
    path = tmp_path / "nblaunch.yaml"
    path.write_text("num_processes: 2\nenv: {A: 1\nbackend: gloo\n")
    with pytest.raises(LaunchConfigError, match=r"is not valid YAML at line \d+, column \d+"):
        notebook_launcher(print, config=str(path))


def test_unknown_keys_warn_and_survive_a_save(tmp_path):
    path = tmp_path / "nblaunch.yaml"
    path.write_text("num_processes: 3\nmy_team_note: keep me\n")
    cf = load_config_file(path)
    assert cf.unknown == {"my_team_note": "keep me"}
    assert cf.warnings == [f"{path}: unknown key 'my_team_note' is kept but ignored"]
    save_config_file(path, {**cf.values, "mixed_precision": "bf16"}, cf.unknown)
    again = load_config_file(path)
    assert again.values == {"num_processes": 3, "mixed_precision": "bf16"}
    assert again.unknown == {"my_team_note": "keep me"}


def test_save_is_atomic_and_refuses_invalid_values(tmp_path):
    path = tmp_path / "nblaunch.yaml"
    path.write_text("num_processes: 3\n")
    with pytest.raises(LaunchConfigError, match="num_processes"):
        save_config_file(path, {"num_processes": -1})
    assert path.read_text() == "num_processes: 3\n"
    save_config_file(path, {"num_processes": 4})
    assert load_config_file(path).values == {"num_processes": 4}
    assert os.listdir(tmp_path) == ["nblaunch.yaml"]  # no temporary file left


def test_accelerate_import_keeps_launcher_keys_aside():
    cf = import_accelerate("num_processes: -1\ngpu_ids: all\ndistributed_type: MULTI_GPU\nfoo: 1\n", text=True)
    assert cf.values == {"gpu_ids": "all"}  # -1 means "decide at launch" in Accelerate
    assert cf.unknown == {"distributed_type": "MULTI_GPU", "foo": 1}


@pytest.mark.parametrize(
    "key, value, fragment",
    [
        ("main_process_ip", "10.0.0.1:29500", "an IP address or host name without port"),
        ("ray_address", "my cluster", "'local', 'auto', 'HOST:PORT' or 'ray://HOST:PORT'"),
        ("engine", "slurm", "one of 'local', 'ray'"),
        ("resources_per_worker", {"CPU": "two"}, "a mapping of resource name to a number >= 0"),
    ],
)
def test_multi_machine_fields_are_validated_naming_key_value_and_file(tmp_path, key, value, fragment):
    import yaml

    path = tmp_path / "nblaunch.yaml"
    path.write_text(yaml.safe_dump({key: value}))
    with pytest.raises(LaunchConfigError) as info:
        resolve_config({}, config=path)
    assert f"invalid {key}={value!r} (in {path})" in str(info.value) and fragment in str(info.value)


def test_multi_machine_fields_accept_what_torchrun_and_ray_take():
    values = {
        "main_process_ip": "node-0.cluster",
        "ray_address": "ray://127.0.0.1:10001",
        "engine": "ray",
        "resources_per_worker": {"CPU": 1},
        "use_gpu": True,
    }
    cfg = resolve_config(values, config=os.devnull)
    assert {k: cfg.values[k] for k in values} == values


def test_metrics_key_reads_yaml_on_and_off_and_names_bad_values(tmp_path):
    # YAML 1.1 reads a bare on/off as true/false: the key means what the user wrote
    (tmp_path / "nblaunch.yaml").write_text("metrics: off\n")
    assert resolve_config({}, cwd=tmp_path).values["metrics"] == "off"
    (tmp_path / "nblaunch.yaml").write_text("metrics: on\n")
    assert resolve_config({}, cwd=tmp_path).values["metrics"] == "on"
    assert resolve_config({"metrics": "off"}, cwd=tmp_path).sources["metrics"] == "argument"
    with pytest.raises(LaunchConfigError, match="metrics.*'maybe'.*one of 'on', 'off'"):
        resolve_config({"metrics": "maybe"}, cwd=tmp_path)
