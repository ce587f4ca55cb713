"""``notebook_launcher()``: Accelerate's function, argument for argument, on nblaunch's launch (``runner.launch``)."""

from __future__ import annotations

import inspect
import sys

from ..config.launch_rules import arguments as config_arguments
from ..errors import LaunchConfigError, LaunchStoppedError, LaunchTimeoutError, WorkerError
from .request import LaunchRequest
from .runner import launch

_LOOPBACK = ("127.0.0.1", "localhost", "::1", "")


def _arg_names(function, args) -> tuple[str, ...]:
    try:
        params = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        params = []
    names = []
    for i in range(len(args)):
        if i < len(params) and params[i].kind in (params[i].POSITIONAL_ONLY, params[i].POSITIONAL_OR_KEYWORD):
            names.append(f"argument {params[i].name!r} (args[{i}])")
        else:
            names.append(f"args[{i}]")
    return tuple(names)


def notebook_launcher(
    function,
    args=(),
    num_processes=None,
    mixed_precision=None,
    use_port=None,
    master_addr="127.0.0.1",
    node_rank=0,
    num_nodes=1,
    rdzv_backend="static",
    rdzv_endpoint="",
    rdzv_conf=None,
    rdzv_id="none",
    max_restarts=0,
    monitor_interval=0.1,
    log_line_prefix_template=None,
    *,
    backend=None,
    start_method=None,
    gpu_ids=None,
    output=None,
    return_all=False,
    timeout=None,
    config=None,
    kwargs=None,
    engine=None,
    metrics=None,
):
    """Run ``function(*args)`` on ``num_processes`` workers with torch.distributed set up; return rank 0's value.

    Takes every argument of ``accelerate.notebook_launcher`` with the same meaning, so replacing
    the import is enough. Keyword-only extras: ``backend`` ("auto" | "nccl" | "gloo"),
    ``start_method`` ("auto" | "fork" | "forkserver" | "spawn"), ``gpu_ids`` ("all" or "0,1"), ``output``
    ("rank0" | "all" | "none"), ``return_all`` (list of every rank's value), ``timeout``
    (seconds), ``config`` (path of an nblaunch.yaml), ``kwargs`` (keyword arguments for
    ``function``), ``engine`` ("local" | "ray": Ray Train on the cluster at ``ray_address``), ``metrics``
    ("on" | "off": whether what Accelerate, Trainer, Lightning and TensorBoard log draws the live chart).
    Anything not given comes from nblaunch.yaml, then defaults. With ``num_nodes > 1`` every
    machine makes the same call (``node_rank`` 0, 1, ...) and torch's elastic launcher joins them
    at ``rdzv_endpoint``; ``num_processes`` is then per machine, as in Accelerate.

    Example::

        >>> def train(lr):
        ...     import torch.distributed as dist
        ...     return dist.get_rank(), lr
        >>> notebook_launcher(train, args=(0.1,), num_processes=2)
        (0, 0.1)

    Raises ``LaunchConfigError`` for bad arguments (before anything starts), ``WorkerError``
    when a rank fails (``LaunchTimeoutError`` after ``timeout``), ``KeyboardInterrupt`` on
    interrupt; in every case all workers are stopped before the call returns.
    """
    if not callable(function):
        raise LaunchConfigError("function", function, "a callable, e.g. a function defined in the notebook")
    if not isinstance(args, (tuple, list)):
        raise LaunchConfigError("args", args, "a tuple of positional arguments, e.g. args=(cfg,)")
    if not isinstance(num_nodes, int) or isinstance(num_nodes, bool) or num_nodes < 1:
        raise LaunchConfigError("num_nodes", num_nodes, "an integer >= 1")
    if num_nodes == 1 and node_rank not in (0, None):
        raise LaunchConfigError("node_rank", node_rank, "0 when num_nodes=1")
    if num_nodes > 1:
        return _across_machines(locals())
    if master_addr not in _LOOPBACK:
        sys.stderr.write(
            f"nblaunch: master_addr={master_addr!r} is only used across machines; a launch on one "
            "machine rendezvous on 127.0.0.1.\n"
        )
    if not isinstance(max_restarts, int) or max_restarts < 0:
        raise LaunchConfigError("max_restarts", max_restarts, "an integer >= 0")
    if monitor_interval is not None and not (isinstance(monitor_interval, (int, float)) and monitor_interval > 0):
        raise LaunchConfigError("monitor_interval", monitor_interval, "a number of seconds > 0")
    if rdzv_backend not in ("static", "c10d", None):
        raise LaunchConfigError("rdzv_backend", rdzv_backend, "'static' or 'c10d'")
    arguments = config_arguments(
        "notebook_launcher",
        num_processes=num_processes,
        mixed_precision=mixed_precision,
        use_port=use_port,
        backend=backend,
        start_method=start_method,
        gpu_ids=gpu_ids,
        output=output,
        timeout=timeout,
        engine=engine,
        metrics=metrics,
    )
    req = LaunchRequest(
        fn=function,
        args=tuple(args),
        kwargs=dict(kwargs or {}),
        arguments=arguments,
        config=config,
        return_all=return_all,
        describe_args=_arg_names(function, args),
        line_prefix=log_line_prefix_template,
    )
    for attempt in range(max_restarts + 1):
        req.restart_count = attempt
        try:
            outcome = launch(req)
            return outcome.values if return_all else outcome.value
        except (LaunchTimeoutError, LaunchStoppedError):  # a stopped run is never restarted
            raise
        except WorkerError as e:
            if attempt == max_restarts:
                raise
            sys.stderr.write(
                f"nblaunch: rank {e.rank} failed; restarting all ranks "
                f"(restart {attempt + 1} of max_restarts={max_restarts}).\n"
            )


def _across_machines(a: dict):
    """num_nodes > 1: every machine makes this same call; torch's elastic launcher joins them."""
    num_nodes, endpoint = a["num_nodes"], a["rdzv_endpoint"]
    if a["rdzv_backend"] not in ("static", "c10d"):
        raise LaunchConfigError("rdzv_backend", a["rdzv_backend"], "'static' or 'c10d'")
    ip, port = None, a["use_port"]
    if endpoint:
        host, sep, p = str(endpoint).rpartition(":")
        if not sep or not host or not p.isdigit():
            raise LaunchConfigError("rdzv_endpoint", endpoint, "'HOST:PORT', the address of machine 0 and a port")
        ip, port = host, int(p)
    elif a["master_addr"] not in _LOOPBACK or a["master_addr"] == "127.0.0.1" and port:
        ip = a["master_addr"]
    per_node = a["num_processes"]  # Accelerate's notebook_launcher counts processes per machine
    arguments = config_arguments(
        "notebook_launcher",
        num_processes=per_node * num_nodes if per_node else None,
        mixed_precision=a["mixed_precision"],
        use_port=port,
        main_process_ip=ip,
        num_machines=num_nodes,
        machine_rank=a["node_rank"],
        rdzv_backend=a["rdzv_backend"] or "static",
        backend=a["backend"],
        start_method=a["start_method"],
        gpu_ids=a["gpu_ids"],
        output=a["output"],
        timeout=a["timeout"],
        metrics=a["metrics"],
    )
    req = LaunchRequest(
        fn=a["function"],
        args=tuple(a["args"]),
        kwargs=dict(a["kwargs"] or {}),
        arguments=arguments,
        config=a["config"],
        return_all=a["return_all"],
        describe_args=_arg_names(a["function"], a["args"]),
        line_prefix=a["log_line_prefix_template"],
        elastic={
            "rdzv_conf": a["rdzv_conf"],
            "rdzv_id": a["rdzv_id"],
            "max_restarts": a["max_restarts"],
            "monitor_interval": a["monitor_interval"],
        },
    )
    outcome = launch(req)
    return outcome.values if a["return_all"] else outcome.value
