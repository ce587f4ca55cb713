"""The three parts checking each other's versions, through a real Jupyter server (jp_fetch): the version
route the panel asks, run folders of another format or written by a kernel with another nblaunch."""

from __future__ import annotations

import json
from pathlib import Path

from harness import fetch, forge_run

from jupyter_ext.version_check import served_labextension_version
from kernelside.run_contract import FORMAT_VERSION
from kernelside.versions import installed_version

REPO_PACKAGE_JSON = Path(__file__).resolve().parents[2] / "package.json"


async def test_version_route_names_the_server_extension_the_run_format_and_the_upgrade_command(jp_fetch):
    response = await jp_fetch("nblaunch", "version")
    answer = json.loads(response.body)
    assert answer["nblaunch"] == installed_version() != "unknown"
    assert answer["run_format"] == FORMAT_VERSION
    assert answer["upgrade"] == "pip install -U nblaunch"
    assert answer["labextension"] == served_labextension_version()  # none on this test server's own paths
    assert answer["nblaunch"] == json.loads(REPO_PACKAGE_JSON.read_text())["version"]


async def test_a_run_folder_of_a_newer_format_is_listed_with_a_note_and_never_read(jp_fetch, run_base):  # noqa: F811 - the fixture imported above
    forged = {"version": FORMAT_VERSION + 1, "nblaunch": "9.0.0", "state": "running", "control": True}
    forge_run(run_base, "run-20300101-000000-future", {**forged, "ranks": [{"rank": 0, "pid": 1}]}, hold_lock=True)
    code, runs = await fetch(jp_fetch)
    assert code == 200 and [r["id"] for r in runs] == ["run-20300101-000000-future"]
    run = runs[0]
    assert run["state"] == "unknown" and run["live"] is False and run["can_stop"] is False
    assert f"run-folder format {FORMAT_VERSION + 1} (by 9.0.0)" in run["note"]
    assert "upgrade the server's nblaunch (pip install -U nblaunch where `jupyter lab` runs)" in run["note"]
    code, detail = await fetch(jp_fetch, "run-20300101-000000-future")
    assert code == 200 and detail["ranks"] == [] and detail["note"] == run["note"]  # pid 1 never sampled
    code, answer = await fetch(jp_fetch, "run-20300101-000000-future", "stop", method="POST")
    assert code == 409


async def test_a_run_folder_without_a_format_is_listed_as_written_by_an_older_kernel(jp_fetch, run_base):  # noqa: F811 - the fixture imported above
    forge_run(run_base, "run-20200101-000000-old", {"version": None, "state": "done"})
    code, runs = await fetch(jp_fetch)
    assert runs[0]["state"] == "unknown"
    assert "format unknown (by another nblaunch)" in runs[0]["note"]
    assert "upgrade the kernel's nblaunch (pip install -U nblaunch in the kernel's environment)" in runs[0]["note"]


async def test_a_run_written_by_a_kernel_with_an_older_nblaunch_is_read_and_names_both_versions(jp_fetch, run_base):  # noqa: F811 - the fixture imported above
    forge_run(run_base, "run-20200101-000000-oldkernel", {"nblaunch": "0.0.1", "state": "done", "world_size": 2})
    forge_run(run_base, "run-20200101-000001-same", {"nblaunch": installed_version(), "state": "done"})
    code, runs = await fetch(jp_fetch)
    by_id = {r["id"]: r for r in runs}
    old = by_id["run-20200101-000000-oldkernel"]
    assert old["state"] == "done" and old["world_size"] == 2  # same format: read as usual
    assert old["note"] == (
        f"written by a kernel with nblaunch 0.0.1; this server has {installed_version()}: "
        "upgrade the kernel's environment (pip install -U nblaunch) so both are the same"
    )
    assert by_id["run-20200101-000001-same"]["note"] is None
