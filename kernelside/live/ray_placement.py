"""Where a Ray world's ranks go: its one placement group, each bundle's resources, and each rank's actor options.

The placement group has one bundle per rank (``resources_per_worker``, a GPU each with ``use_gpu``), placed by
``placement_strategy`` (PACK unless said; STRICT_PACK: one whole node, STRICT_SPREAD: one rank per node); one
that the cluster cannot hold fails within ``PLACEMENT_WAIT_S`` with what was asked and what each node has, and
nothing is left. A rank's actor is pinned to its bundle by index, so a lost rank's replacement goes into the
bundle it left (``live.ray_world.RayWorld.replace``).

With GPUs, Ray's masking of ``CUDA_VISIBLE_DEVICES`` to each actor's own GPU is turned off
(``NOSET_CUDA_VISIBLE_DEVICES``): NCCL on NVSwitch machines needs every rank of a node to see the node's GPUs
(NVIDIA-NeMo/RL #2252, NVIDIA/nccl #1749, #1906). Each rank then picks its own GPU by index
(``worker.ray_live_rank.cuda_index``: the GPU Ray gave it, which is its local rank where the ranks hold the
node's GPUs in order), and sets it (``torch.cuda.set_device``) before its process group is made.

Example::

    >>> bundle_of({"resources_per_worker": {"CPU": 2}, "use_gpu": False})
    {'CPU': 2.0}
"""

from __future__ import annotations

from ..errors import LaunchConfigError

PLACEMENT_WAIT_S = 10.0  # a placement group not ready by then cannot be placed: the start fails, saying why
NOSET_CUDA_VISIBLE_DEVICES = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"  # Ray's switch (ray._private.accelerators)


def bundle_of(cfg: dict) -> dict:
    """One rank's bundle: its CPUs (1 unless said), a GPU with ``use_gpu``, and any custom resources."""
    per_worker = {str(k): float(v) for k, v in dict(cfg["resources_per_worker"]).items()}
    bundle = {"CPU": per_worker.pop("CPU", 1.0)}
    if cfg["use_gpu"]:
        bundle["GPU"] = per_worker.pop("GPU", 1.0)
    bundle.update(per_worker)
    return bundle


def strategy_of(cfg: dict) -> str:
    """The placement strategy of the plan's Ray settings (PACK unless said)."""
    return cfg.get("placement_strategy") or "PACK"


def place(ray, n: int, bundle: dict, address: str, strategy: str = "PACK"):
    """The placement group, ready; or a LaunchConfigError within PLACEMENT_WAIT_S, and nothing left."""
    from ray.util.placement_group import placement_group, remove_placement_group

    pg = placement_group([dict(bundle) for _ in range(n)], strategy=strategy)
    ready, _ = ray.wait([pg.ready()], timeout=PLACEMENT_WAIT_S)
    if ready:
        return pg
    remove_placement_group(pg)
    asked = ", ".join(f"{k} {v:g}" for k, v in bundle.items())
    raise LaunchConfigError(
        "num_processes",
        n,
        None,
        message=f"the Ray cluster at {address!r} cannot place {n} live ranks of {{{asked}}} each ({strategy}) within "
        f"{PLACEMENT_WAIT_S:g}s. The cluster has: {cluster_has(ray, bundle)}. Use fewer processes, smaller "
        f"resources_per_worker{', another placement_strategy' if strategy != 'PACK' else ''}, or a larger cluster. "
        "Nothing was started.",
    )


def cluster_has(ray, bundle: dict) -> str:
    """Each live node's resources of the bundle's kinds, and what is free in all."""
    nodes = [nd for nd in ray.nodes() if nd.get("Alive")]
    free = ray.available_resources()
    parts = []
    for nd in nodes:
        res = nd.get("Resources", {})
        have = ", ".join(f"{k} {res.get(k, 0):g}" for k in bundle)
        parts.append(f"node {nd.get('NodeManagerAddress')} ({nd['NodeID'][:8]}): {have}")
    total = ", ".join(f"{k} {free.get(k, 0):g}" for k in bundle)
    return f"{'; '.join(parts) or 'no live node'}; free now in all: {total}"


def actor_options(pg, index: int, bundle: dict) -> dict:
    """The ``.options()`` of the actor of bundle ``index``: its bundle's resources, never restarted by Ray (a rank's
    state cannot come back by re-running a constructor: nblaunch replaces a lost rank itself); with a GPU, Ray's
    ``CUDA_VISIBLE_DEVICES`` masking off (see the module docstring).

    Example::

        >>> actor_options(pg, 1, {"CPU": 1.0, "GPU": 1.0})["runtime_env"]   # doctest: +SKIP
        {'env_vars': {'RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES': '1'}}
    """
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    rest = {k: v for k, v in bundle.items() if k not in ("CPU", "GPU")}
    gpu = {"runtime_env": {"env_vars": {NOSET_CUDA_VISIBLE_DEVICES: "1"}}} if bundle.get("GPU") else {}
    return {
        **gpu,
        "num_cpus": bundle["CPU"],
        "num_gpus": bundle.get("GPU", 0),
        "resources": rest or None,
        "max_restarts": 0,
        "max_task_retries": 0,
        "scheduling_strategy": PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=index),
    }


def start_actor(ray, pg, index: int, bundle: dict):
    """A live rank's actor in bundle ``index`` of ``pg`` (it starts as Ray places it: ask it ``where()``)."""
    from ..worker.ray_live_rank import LiveRankActor

    return ray.remote(LiveRankActor).options(**actor_options(pg, index, bundle)).remote()
