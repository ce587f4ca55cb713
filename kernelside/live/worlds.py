"""Which world a live session's plan gets: the ranks as this machine's processes (``live.world.World``) or as
actors on a Ray cluster (``live.ray_world.RayWorld``). Both stand behind one interface (``live.world.WorldBase``),
so the session, the request engine, the Runs entry and the display never ask which one runs.

Example::

    >>> world = make_world(plan, log_dir, out, err, render="widgets", namespace=dict)   # doctest: +SKIP
"""

from __future__ import annotations

from .world import World, WorldBase


def make_world(plan, log_dir: str, out, err, *, render: str, namespace) -> WorldBase:
    """The world of this plan: the ranks as this machine's processes, or as actors on a Ray cluster
    (``live.ray_world``, imported only then: Ray is an optional extra)."""
    if plan.engine == "ray":
        from .ray_world import RayWorld

        return RayWorld(plan, log_dir, out, err, render=render)
    return World(plan, log_dir, out, err, render=render, namespace=namespace)
