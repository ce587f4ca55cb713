"""The engines, by name: the one table the launch consults.

Every engine is an ``engines.contract.Engine`` (in the spirit of torch elastic's ``PContext``):
it starts ranks, reports what it observes to the run recorder, and stops them; the policy
(deadline, grace, stop, Ctrl-C) is ``launch.runner.run_engine``'s. The outcome is the
recorder's, never the engine's.

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
