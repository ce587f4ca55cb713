"""Which nblaunch is installed here: the one version the three parts (the kernel's ``kernelside``, the
server extension, the labextension) compare, and the words they use when they differ.

The kernel may live in another environment than the Jupyter server (a JupyterHub or conda kernel), so
each run folder records the version of the ``kernelside`` that wrote it (``state.json``'s ``nblaunch``)
and the server compares it with its own. Standard library only: the server imports this.

Example::

    >>> installed_version() == installed_version()
    True
    >>> version_difference("0.1.0", "0.1.0") is None
    True
"""

from __future__ import annotations

from importlib import metadata

DISTRIBUTION = "nblaunch"
UPGRADE_COMMAND = f"pip install -U {DISTRIBUTION}"


def installed_version() -> str:
    """The installed distribution's version (``"unknown"`` when run from a checkout that was never installed)."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"


def _key(version: str) -> tuple:
    parts = []
    for piece in version.split("."):
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits) if digits else -1)
    return tuple(parts)


def version_difference(ours: str, theirs: str) -> str | None:
    """``"older"`` / ``"newer"`` when ``theirs`` differs from ``ours`` (``"other"`` if they cannot be ordered)."""
    if ours == theirs:
        return None
    if "unknown" in (ours, theirs):
        return "other"
    a, b = _key(ours), _key(theirs)
    return "older" if b < a else "newer" if b > a else "other"
