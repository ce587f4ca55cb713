"""A real ``jupyter server`` with nblaunch's extension never loads torch: not to start, not to answer
``/nblaunch/config``, ``/nblaunch/runs`` and ``/nblaunch/hardware``.

The server runs as its own process on 127.0.0.1 and a port the OS gives it (``--port=0``), with a
test-only extension (``tests/server_modules_probe.py``) that answers the server's ``sys.modules`` and
logs when the server listens; the process's ``/proc/PID/maps`` says whether libtorch was ever mapped.
The test stops the server by its pid.
"""

from __future__ import annotations

import pytest
from harness import SERVER_START_TIMEOUT_S, JupyterServer


@pytest.fixture
def server(starts_processes, tmp_path):
    srv = JupyterServer(str(tmp_path))
    try:
        assert srv.running.wait(SERVER_START_TIMEOUT_S) and srv.port, "".join(srv.log[-30:])
        yield srv
    finally:
        srv.stop()


def test_the_server_answers_the_panels_routes_without_ever_loading_torch(server):
    assert server.get("api/status")[0] == 200
    code, config = server.get("nblaunch/config")
    assert code == 200 and "num_processes" in config["values"] and config["schema"]
    code, runs = server.get("nblaunch/runs")
    assert code == 200 and isinstance(runs, list)
    code, hardware = server.get("nblaunch/hardware")
    assert code == 200 and hardware["cpu_count"] >= 1 and isinstance(hardware["gpus"], list)
    assert hardware["torch_version"]  # read from torch's version file, not by importing torch

    _, loaded = server.get("nblaunch-test/modules")
    assert "jupyter_ext.runs" in loaded and "kernelside.run_contract" in loaded  # the extension did load
    heavy = [m for m in loaded if m.split(".")[0] in ("torch", "accelerate", "transformers")]
    assert heavy == [], f"the server imported {heavy[:10]}"
    with open(f"/proc/{server.proc.pid}/maps") as fh:
        torch_libraries = sorted({line.split()[-1] for line in fh if "libtorch" in line})
    assert torch_libraries == [], f"the server mapped {torch_libraries}"
