"""The server extension's side of the version check between nblaunch's three parts.

``GET /nblaunch/version`` tells the panel which server extension answers (and which labextension this
server serves), so the panel can say exactly what to upgrade when they differ. Run folders are read
only in the format this server knows (``run_contract.FORMAT_VERSION``); a folder of another format is
listed with a note instead of being misread, and a run written by a kernel with another nblaunch gets
a note naming both versions.

Example::

    >>> run_format_note({"version": 1}) is None
    True
    >>> run_format_note({"version": 2}).startswith("written in run-folder format 2")
    True
"""

from __future__ import annotations

import json

from jupyter_core.paths import jupyter_path

from kernelside.run_contract import FORMAT_VERSION
from kernelside.versions import UPGRADE_COMMAND, installed_version, version_difference


def served_labextension_version() -> str | None:
    """The version of the nblaunch labextension JupyterLab loads from this environment (the first on its path)."""
    for path in jupyter_path("labextensions", "nblaunch", "package.json"):
        try:
            with open(path, encoding="utf-8") as f:
                version = json.load(f).get("version")
        except (OSError, ValueError, AttributeError):
            continue
        return version if isinstance(version, str) else None
    return None


def server_versions() -> dict:
    """What ``GET /nblaunch/version`` answers."""
    return {
        "nblaunch": installed_version(),
        "run_format": FORMAT_VERSION,
        "labextension": served_labextension_version(),
        "upgrade": UPGRADE_COMMAND,
    }


def run_format_note(state: dict) -> str | None:
    """Why this server does not read a state file of another format, and what to do; None when it reads it."""
    found = state.get("version")
    if found == FORMAT_VERSION:
        return None
    shown = found if isinstance(found, (int, str)) and not isinstance(found, bool) else "unknown"
    by = state.get("nblaunch") if isinstance(state.get("nblaunch"), str) else "another nblaunch"
    if isinstance(found, int) and not isinstance(found, bool) and found > FORMAT_VERSION:
        fix = f"upgrade the server's nblaunch ({UPGRADE_COMMAND} where `jupyter lab` runs) and restart it"
    else:
        fix = f"upgrade the kernel's nblaunch ({UPGRADE_COMMAND} in the kernel's environment) and run it again"
    return (
        f"written in run-folder format {shown} (by {by}); this server ({installed_version()}) reads format "
        f"{FORMAT_VERSION} only, so its state is not shown: {fix}"
    )


def kernel_version_note(state: dict) -> str | None:
    """A note when the kernel that wrote this run has another nblaunch than this server; None when they match."""
    kernel = state.get("nblaunch")
    if not isinstance(kernel, str):
        return None
    server = installed_version()
    which = version_difference(server, kernel)
    if which is None:
        return None
    where = {"older": "the kernel's", "newer": "the server's"}.get(which, "the older one's")
    return (
        f"written by a kernel with nblaunch {kernel[:40]}; this server has {server}: "
        f"upgrade {where} environment ({UPGRADE_COMMAND}) so both are the same"
    )
