"""ConfigStore, the logic behind the panel's REST API, exercised without HTTP."""

from __future__ import annotations

import os

import pytest
import yaml

from jupyter_ext.config_store import ConfigStore
from jupyter_ext.errors import PanelRequestError
from kernelside import config


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """A server root with no config around it: no $NBLAUNCH_CONFIG, no Accelerate default."""
    monkeypatch.delenv(config.ENV_CONFIG, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    root = tmp_path / "root"
    root.mkdir()
    return root


def test_without_a_file_the_panel_edits_root_nblaunch_yaml_with_defaults(isolated):
    info = ConfigStore(isolated).read()
    assert info["path"] == str(isolated / "nblaunch.yaml")
    assert info["display_path"] == "nblaunch.yaml"
    assert info["exists"] is False and info["source"] == "none"
    assert info["values"] == config.defaults()
    assert [f["name"] for f in info["schema"]] == [f.name for f in config.FIELDS]


def test_save_writes_yaml_that_the_kernel_side_loads(isolated):
    store = ConfigStore(isolated)
    answer = store.save({"values": {**config.defaults(), "num_processes": 3, "mixed_precision": "bf16"}})
    assert answer["saved"] is True and answer["exists"] is True
    loaded = config.load_config_file(isolated / "nblaunch.yaml")
    assert loaded.values == {"num_processes": 3, "mixed_precision": "bf16"}
    assert config.resolve_config(cwd=isolated).values["num_processes"] == 3


def test_save_keeps_unknown_keys_and_reports_them_as_warnings(isolated):
    path = isolated / "nblaunch.yaml"
    path.write_text("num_processes: 2\nmy_team_setting: {a: 1}\n")
    store = ConfigStore(isolated)
    info = store.read()
    assert info["unknown_keys"] == ["my_team_setting"]
    assert any("my_team_setting" in w for w in info["warnings"])
    store.save({"values": {"num_processes": 4}})
    assert yaml.safe_load(path.read_text()) == {"num_processes": 4, "my_team_setting": {"a": 1}}


def test_invalid_values_are_refused_per_field_and_the_file_is_untouched(isolated):
    path = isolated / "nblaunch.yaml"
    path.write_text("num_processes: 2\n")
    with pytest.raises(PanelRequestError) as caught:
        ConfigStore(isolated).save({"values": {"num_processes": 0, "backend": "mpi", "timeout": "soon"}})
    assert caught.value.status == 400
    assert set(caught.value.fields) == {"num_processes", "backend", "timeout"}
    assert "'auto', 'nccl', 'gloo'" in caught.value.fields["backend"]
    assert path.read_text() == "num_processes: 2\n"


def test_unknown_keys_in_a_save_request_are_refused(isolated):
    with pytest.raises(PanelRequestError) as caught:
        ConfigStore(isolated).save({"values": {"num_procs": 2}})
    assert caught.value.status == 400 and "num_procs" in caught.value.fields


def test_a_file_that_does_not_parse_is_reported_with_its_line_and_not_overwritten(isolated):
    path = isolated / "nblaunch.yaml"
    broken = "num_processes: 2\nenv: {A: 1\nbackend: gloo\n"
    path.write_text(broken)
    store = ConfigStore(isolated)
    info = store.read()
    assert info["error"]["line"] == 3 and "not valid YAML" in info["error"]["message"]
    with pytest.raises(PanelRequestError) as caught:
        store.save({"values": {"num_processes": 3}})
    assert caught.value.status == 409 and caught.value.detail["error"]["line"] == 3
    assert path.read_text() == broken
    store.save({"values": {"num_processes": 3}, "overwrite": True})
    assert yaml.safe_load(path.read_text()) == {"num_processes": 3}


def test_an_invalid_value_in_the_file_shows_on_its_field_and_other_values_load(isolated):
    (isolated / "nblaunch.yaml").write_text("backend: gloo\nnum_processes: -1\nextra: 1\n")
    info = ConfigStore(isolated).read()
    assert info["error"]["key"] == "num_processes" and info["error"]["line"] == 2
    assert "num_processes" in info["field_errors"]
    assert info["values"]["num_processes"] == -1  # shown as it is, to be fixed in the form
    assert info["values"]["backend"] == "gloo"
    assert info["unknown_keys"] == ["extra"]


def test_save_is_atomic_and_leaves_no_temporary_file(isolated, monkeypatch):
    path = isolated / "nblaunch.yaml"
    path.write_text("num_processes: 2\n")
    replaced = []
    real_replace = os.replace

    def spy(src, dst):
        replaced.append((os.path.dirname(src), os.path.basename(src), str(dst)))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    ConfigStore(isolated).save({"values": {"num_processes": 5}})
    [(folder, tmp_name, target)] = replaced
    assert folder == str(isolated) and tmp_name.startswith(".nblaunch.yaml.") and target == str(path)
    assert sorted(p.name for p in isolated.iterdir()) == ["nblaunch.yaml"]


def test_the_file_a_kernel_in_the_root_reads_is_the_one_edited(isolated, monkeypatch):
    parent_config = isolated.parent / "nblaunch.yaml"
    parent_config.write_text("num_processes: 6\n")
    info = ConfigStore(isolated).read()
    assert info["path"] == str(parent_config) and info["values"]["num_processes"] == 6
    monkeypatch.setenv(config.ENV_CONFIG, "team.yaml")
    assert ConfigStore(isolated).target_path() == isolated / "team.yaml"


def test_accelerate_default_config_is_shown_but_saves_go_to_nblaunch_yaml(isolated, tmp_path):
    acc = tmp_path / "hf" / "accelerate" / "default_config.yaml"
    acc.parent.mkdir(parents=True)
    acc.write_text("distributed_type: MULTI_GPU\nnum_processes: 4\nmixed_precision: fp16\n")
    store = ConfigStore(isolated)
    info = store.read()
    assert info["source"] == "accelerate" and info["read_from"] == str(acc)
    assert info["values"]["num_processes"] == 4 and info["path"] == str(isolated / "nblaunch.yaml")
    store.save({"values": info["values"]})
    assert acc.read_text() == "distributed_type: MULTI_GPU\nnum_processes: 4\nmixed_precision: fp16\n"
    assert config.load_config_file(isolated / "nblaunch.yaml").values["mixed_precision"] == "fp16"


def test_import_reads_overlapping_keys_from_a_file_under_the_root(isolated):
    (isolated / "acc.yaml").write_text("num_processes: 8\ngpu_ids: 0,1\nmixed_precision: bf16\ntpu_env: []\n")
    answer = ConfigStore(isolated).import_accelerate({"path": "acc.yaml"})
    assert answer["values"] == {"num_processes": 8, "gpu_ids": "0,1", "mixed_precision": "bf16"}


def test_import_without_an_accelerate_default_config_says_how_to_make_one(isolated):
    with pytest.raises(PanelRequestError) as caught:
        ConfigStore(isolated).import_accelerate({})
    assert caught.value.status == 404 and "accelerate config" in caught.value.message


@pytest.mark.parametrize("path", ["../outside.yaml", "/etc/passwd", "sub/../../x.yaml"])
def test_paths_outside_the_root_are_forbidden(isolated, path):
    store = ConfigStore(isolated)
    for action in (store.import_accelerate, store.export_accelerate):
        with pytest.raises(PanelRequestError) as caught:
            action({"path": path, "values": {}})
        assert caught.value.status == 403


def test_a_symlink_leading_outside_the_root_is_forbidden(isolated, tmp_path):
    (tmp_path / "secret.yaml").write_text("num_processes: 1\n")
    (isolated / "link.yaml").symlink_to(tmp_path / "secret.yaml")
    with pytest.raises(PanelRequestError) as caught:
        ConfigStore(isolated).import_accelerate({"path": "link.yaml"})
    assert caught.value.status == 403


def test_export_writes_an_accelerate_config_and_the_command_to_use_it(isolated):
    answer = ConfigStore(isolated).export_accelerate(
        {"path": "out.yaml", "values": {"num_processes": 2, "use_cpu": True}}
    )
    written = yaml.safe_load((isolated / "out.yaml").read_text())
    assert written["distributed_type"] == "MULTI_CPU" and written["num_processes"] == 2
    assert answer["command"] == "accelerate launch --config_file out.yaml train.py"


def test_export_refuses_to_replace_the_nblaunch_config_itself(isolated):
    with pytest.raises(PanelRequestError) as caught:
        ConfigStore(isolated).export_accelerate({"path": "nblaunch.yaml", "values": {}})
    assert caught.value.status == 400
