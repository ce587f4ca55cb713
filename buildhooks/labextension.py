"""The labextension's build during ``pip install`` / ``pip wheel`` (hatch-jupyter-builder's build-function).

hatch-jupyter-builder's own ``npm_builder`` runs ``npm install``, which may move the Node packages to
other versions than ``package-lock.json`` names; a release must build from exactly the locked ones, so this
runs ``npm ci`` (a clean install of the lock file; it fails when package.json and the lock disagree). An
editable install (``pip install -e .``, ``make lab``) keeps node_modules when it is already the lock's, as
``make frontend`` does, so a rebuild does not download anything again.

Example (pyproject.toml)::

    [tool.hatch.build.hooks.jupyter-builder]
    build-function = "buildhooks.labextension.build"
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path


def _node_modules_current(root: Path) -> bool:
    """npm writes node_modules/.package-lock.json at each install: current when newer than the lock file."""
    installed = root / "node_modules" / ".package-lock.json"
    lock = root / "package-lock.json"
    return installed.is_file() and installed.stat().st_mtime >= lock.stat().st_mtime


def _built_after_sources(root: Path) -> bool:
    """The labextension is newer than every TypeScript source, style and package file (an editable rebuild skips)."""
    built = root / "jupyter_ext" / "labextension" / "package.json"
    if not built.is_file():
        return False
    sources = [root / "package.json", root / "package-lock.json", root / "tsconfig.json"]
    sources += [p for d in ("src", "style") for p in (root / "jupyter_ext" / d).rglob("*") if p.is_file()]
    return all(built.stat().st_mtime >= p.stat().st_mtime for p in sources)


def build(target_name: str, version: str, build_cmd: str = "build:prod", editable_build_cmd: str = "build") -> None:
    """Install the locked Node packages and build the labextension into jupyter_ext/labextension."""
    if os.environ.get("HATCH_JUPYTER_BUILDER_SKIP_NPM") == "1":
        return
    root = Path.cwd()
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError(
            "nblaunch: building the JupyterLab extension from source needs Node.js >= 18 and npm on PATH; "
            "install them, or install a built wheel of nblaunch (it carries the compiled extension)."
        )
    if not (root / "package-lock.json").is_file():
        raise RuntimeError(f"nblaunch: {root / 'package-lock.json'} is missing: the build follows the lock file only.")
    if version == "editable" and _built_after_sources(root):
        return
    env = dict(os.environ, PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD="1")
    if version != "editable" or not _node_modules_current(root):
        subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=root, env=env, check=True)
    command = editable_build_cmd if version == "editable" else build_cmd
    subprocess.run([npm, "run", command], cwd=root, env=env, check=True)
