"""The engines, by name: the one table the launch consults.

Every engine has the same small interface (in the spirit of torch elastic's ``PContext``):

- ``Engine(req, plan, log_dir, out, err)`` — nothing starts yet;
- ``start(recorder)`` — start the ranks and tell the recorder about them (``add_ranks``);
- ``wait(recorder)`` — feed the recorder every observation until each rank has ended (or the
  grace period after the first failure is over); the recorder calls ``stop()`` at the first failure;
- ``close(grace)`` — whatever is left is stopped, reaped and freed (safe to call twice);

plus the class attributes ``clock`` (the clock its ranks' event times are read on),
``routes_output`` (the kernel routes rank output to the cell and logs) and ``peer_hint`` (a line
added when a rank failed because a peer went away). The outcome is the recorder's, never the
engine's.

Example::

    >>> engine_class("local").clock
    'monotonic'
"""

from __future__ import annotations

import importlib.util
import sys

from ..errors import LaunchConfigError

ENGINES = ("local", "elastic", "ray")
RAY_INSTALL_HINT = "pip install 'nblaunch[ray]' (or pip install 'ray[train]')"


def engine_class(name: str):
    """The engine class for ``name`` (imported only when used: Ray is an optional extra)."""
    if name == "local":
        from .local import LocalEngine

        return LocalEngine
    if name == "elastic":
        from .elastic import ElasticEngine

        return ElasticEngine
    if name == "ray":
        require(name)
        from .ray_train import RayEngine

        return RayEngine
    raise LaunchConfigError("engine", name, "one of " + ", ".join(repr(e) for e in ENGINES))


def require(name: str) -> None:
    """A clear error, before anything starts, when an engine's library is not installed."""
    if name != "ray":
        return
    try:
        found = importlib.util.find_spec("ray") is not None and importlib.util.find_spec("ray.train") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise LaunchConfigError(
            "engine",
            "ray",
            None,
            message=f"engine='ray' needs Ray Train, which is not installed in this kernel's environment "
            f"({sys.executable}). Install it with {RAY_INSTALL_HINT}, or use engine='local'. Nothing was started.",
        )
