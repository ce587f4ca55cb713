"""The /nblaunch/ REST API through a real Jupyter server (pytest-jupyter's jp_fetch)."""

from __future__ import annotations

import json
import os

import pytest
import torch
import yaml
from harness import fetch_json

from kernelside import config


async def test_get_config_returns_path_values_schema_and_warnings(jp_fetch, jp_root_dir):
    (jp_root_dir / "nblaunch.yaml").write_text("num_processes: 2\nlegacy_key: 1\n")
    code, body = await fetch_json(jp_fetch, "config")
    assert code == 200
    assert body["path"] == str(jp_root_dir / "nblaunch.yaml") and body["display_path"] == "nblaunch.yaml"
    assert body["values"]["num_processes"] == 2 and body["values"]["backend"] == "auto"
    assert {f["name"] for f in body["schema"]} == set(config.FIELDS_BY_NAME)
    assert body["warnings"] == [f"{jp_root_dir / 'nblaunch.yaml'}: unknown key 'legacy_key' is kept but ignored"]


async def test_put_config_validates_then_saves_keeping_unknown_keys(jp_fetch, jp_root_dir):
    (jp_root_dir / "nblaunch.yaml").write_text("legacy_key: 1\n")
    code, body = await fetch_json(
        jp_fetch, "config", method="PUT", body={"values": {"num_processes": 3, "mixed_precision": "bf16"}}
    )
    assert code == 200 and body["saved"] is True and body["values"]["num_processes"] == 3
    on_disk = yaml.safe_load((jp_root_dir / "nblaunch.yaml").read_text())
    assert on_disk == {"num_processes": 3, "mixed_precision": "bf16", "legacy_key": 1}


async def test_put_with_bad_values_answers_400_with_a_message_per_field(jp_fetch, jp_root_dir):
    code, body = await fetch_json(
        jp_fetch, "config", method="PUT", body={"values": {"num_processes": "three", "start_method": "threads"}}
    )
    assert code == 400
    assert set(body["fields"]) == {"num_processes", "start_method"}
    assert "'auto', 'fork', 'forkserver', 'spawn'" in body["fields"]["start_method"]
    assert not (jp_root_dir / "nblaunch.yaml").exists()


@pytest.mark.parametrize(
    "body, expected",
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ({"values": "num_processes=2"}, "'values' must be a JSON object"),
        ({"values": {}, "overwrite": "yes"}, "overwrite must be true or false"),
        (b"\xff\xfe", "not valid JSON"),
    ],
)
async def test_malformed_requests_answer_400_with_a_message_never_a_traceback(jp_fetch, body, expected):
    code, answer = await fetch_json(jp_fetch, "config", method="PUT", body=body)
    assert code == 400
    assert expected in answer["message"]
    assert "Traceback" not in json.dumps(answer)


async def test_put_does_not_overwrite_a_file_that_fails_to_parse(jp_fetch, jp_root_dir):
    path = jp_root_dir / "nblaunch.yaml"
    path.write_text("num_processes: [2\n")
    code, got = await fetch_json(jp_fetch, "config")
    assert code == 200 and got["error"]["line"] == 2
    code, answer = await fetch_json(jp_fetch, "config", method="PUT", body={"values": {"num_processes": 2}})
    assert code == 409 and answer["error"]["line"] == 2 and "not overwritten" in answer["message"]
    assert path.read_text() == "num_processes: [2\n"


async def test_hardware_reports_cpus_ram_and_torch_without_gpus_here(jp_fetch):
    code, body = await fetch_json(jp_fetch, "hardware")
    assert code == 200
    assert body["cpu_count"] == len(os.sched_getaffinity(0))
    assert body["ram_bytes"] > 0
    assert body["torch_version"] == torch.__version__
    assert body["gpus"] == [
        {
            "index": i,
            "name": torch.cuda.get_device_name(i),
            "memory_bytes": torch.cuda.get_device_properties(i).total_memory,
        }
        for i in range(torch.cuda.device_count())
    ]


async def test_import_and_export_accelerate_round_trip_under_the_root(jp_fetch, jp_root_dir):
    code, exported = await fetch_json(
        jp_fetch,
        "accelerate",
        "export",
        method="POST",
        body={"path": "acc.yaml", "values": {"num_processes": 4, "use_cpu": True, "mixed_precision": "bf16"}},
    )
    assert code == 200 and exported["display_path"] == "acc.yaml"
    assert yaml.safe_load((jp_root_dir / "acc.yaml").read_text())["distributed_type"] == "MULTI_CPU"
    code, imported = await fetch_json(jp_fetch, "accelerate", "import", method="POST", body={"path": "acc.yaml"})
    assert code == 200
    assert imported["values"]["num_processes"] == 4 and imported["values"]["mixed_precision"] == "bf16"


@pytest.mark.parametrize("route", [("accelerate", "import"), ("accelerate", "export")])
async def test_paths_outside_the_server_root_answer_403(jp_fetch, route):
    code, body = await fetch_json(jp_fetch, *route, method="POST", body={"path": "../../etc/passwd", "values": {}})
    assert code == 403 and "outside the server's root" in body["message"]


async def test_export_with_invalid_values_answers_400_per_field(jp_fetch, jp_root_dir):
    code, body = await fetch_json(
        jp_fetch, "accelerate", "export", method="POST", body={"path": "acc.yaml", "values": {"mixed_precision": "fp4"}}
    )
    assert code == 400 and "mixed_precision" in body["fields"]
    assert not (jp_root_dir / "acc.yaml").exists()


@pytest.mark.parametrize(
    "method, path",
    [
        ("GET", "config"),
        ("PUT", "config"),
        ("GET", "hardware"),
        ("POST", "accelerate/import"),
        ("POST", "accelerate/export"),
    ],
)
async def test_every_route_requires_authentication(http_server_client, jp_base_url, jp_serverapp, method, path):
    body = None if method == "GET" else json.dumps({"values": {}})
    response = await http_server_client.fetch(
        f"{jp_base_url}nblaunch/{path}", method=method, body=body, raise_error=False
    )
    assert response.code == 403
    assert b"Traceback" not in response.body


async def test_put_replaces_the_file_by_rename_and_leaves_nothing_else(jp_fetch, jp_root_dir):
    path = jp_root_dir / "nblaunch.yaml"
    path.write_text("num_processes: 2\n")
    before = path.stat().st_ino
    code, _ = await fetch_json(jp_fetch, "config", method="PUT", body={"values": {"num_processes": 4}})
    assert code == 200
    # a new inode: the text was written to a temporary file that was renamed over the old one
    assert path.stat().st_ino != before
    assert sorted(p.name for p in jp_root_dir.iterdir()) == ["nblaunch.yaml"]
    assert path.read_text() == "num_processes: 4\n"
