"""Run a "notebook" of its own for scenarios that initialize CUDA in the launching process.

Once CUDA is up in a process it stays up, and no later launch from it may fork; so each
such scenario is a script in a fresh interpreter, written to a file (its file:line is what
nblaunch must name) and run from the checkout. The script's last stdout line is
``RESULT <json>``.

Example::

    >>> facts, run = run_scenario(tmp_path, "import json\\nprint('RESULT ' + json.dumps({'x': 1}))")
    >>> facts
    {'x': 1}
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def line_of(source: str, marker: str) -> int:
    """The 1-based line of ``source`` holding ``marker``."""
    return next(i for i, text in enumerate(source.splitlines(), 1) if marker in text)


def run_scenario(tmp_path, source: str, *args: str, name: str = "scenario.py", timeout: float = 150):
    """Write ``source`` to ``tmp_path/name``, run it; (the RESULT json, the CompletedProcess). Raises on failure."""
    path = tmp_path / name
    path.write_text(source)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)}
    run = subprocess.run(
        [sys.executable, str(path), *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )
    results = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    assert run.returncode == 0 and results, (
        f"{name} exited with {run.returncode}\n--- stdout ---\n{run.stdout[-4000:]}\n"
        f"--- stderr ---\n{run.stderr[-4000:]}"
    )
    return json.loads(results[-1].removeprefix("RESULT ")), run
