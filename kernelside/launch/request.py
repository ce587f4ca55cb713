"""What a launch is asked to do, and what it gives back. Plain data shared by the engine and its callers.

Example::

    >>> req = LaunchRequest(fn=train, args=(0.1,), arguments={"num_processes": 2})   # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses

from .report import LaunchReport


@dataclasses.dataclass
class LaunchRequest:
    """What to run and how. ``arguments`` holds only explicitly given config keys (schema names)."""

    fn: object
    args: tuple = ()
    kwargs: dict = dataclasses.field(default_factory=dict)
    arguments: dict = dataclasses.field(default_factory=dict)
    config: str | None = None
    return_all: bool = False
    describe_args: tuple[str, ...] | None = None  # names for args in error messages
    on_event: object = None  # callable(rank, kind, payload), called for every worker event
    stdout: object = None
    stderr: object = None
    return_rank: int | None = None  # the rank whose value the caller wants (--return-from): must exist in the plan
    namespace: dict | None = None  # the notebook names a cell program reads (``launch.payload.Payload``)
    line_prefix: str | None = None  # torchrun-style template: "${rank}", "${local_rank}", "${role_name}"
    restart_count: int = 0
    elastic: dict = dataclasses.field(default_factory=dict)  # rdzv_conf, rdzv_id, max_restarts... (multi-machine)


@dataclasses.dataclass
class LaunchOutcome:
    value: object
    values: list | None
    report: LaunchReport
