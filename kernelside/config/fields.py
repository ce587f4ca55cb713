"""The schema of the launch configuration: every key, its type, default, allowed values and help, as
the server extension and the panel show it (``launch_rules.py`` has the names and defaults every
launch path shares).

Example::

    >>> FIELDS_BY_NAME["main_process_port"].maximum
    65535

Checking a value against it is ``field_checks.py``'s.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class Field:
    """One configuration key: its type, default, allowed values and help text."""

    name: str
    type: str  # "int" | "str" | "bool" | "float" | "dict" | "list"
    default: Any
    help: str
    group: str
    choices: tuple | None = None
    nullable: bool = False
    minimum: float | None = None
    accelerate: bool = False  # the key exists with the same meaning in Accelerate's config
    maximum: float | None = None
    above_minimum: bool = False  # the minimum itself is not allowed (a timeout of 0 s)

    def to_json(self) -> dict:
        out = dataclasses.asdict(self)
        out["choices"] = list(self.choices) if self.choices is not None else None
        return out


MIXED_PRECISION = ("no", "fp16", "bf16", "fp8")

FIELDS: tuple[Field, ...] = (
    Field(
        "num_processes",
        "int",
        None,
        "Number of worker processes. Empty: one per visible GPU, or 2 without GPUs.",
        "processes",
        nullable=True,
        minimum=1,
        accelerate=True,
    ),
    Field(
        "gpu_ids",
        "str",
        "all",
        "GPUs to use, as 'all' or comma-separated indices ('0,1'); sets CUDA_VISIBLE_DEVICES.",
        "processes",
        accelerate=True,
    ),
    Field("use_cpu", "bool", False, "Run on CPU even when GPUs are present.", "processes", accelerate=True),
    Field(
        "backend",
        "str",
        "auto",
        "Process-group backend. auto: nccl when every rank has its own GPU, gloo otherwise.",
        "processes",
        choices=("auto", "nccl", "gloo"),
    ),
    Field(
        "start_method",
        "str",
        "auto",
        "How workers start. auto: fork unless CUDA is already initialized in the kernel, then the forkserver "
        "(ranks forked from a clean process that holds torch); spawn: fresh interpreters.",
        "processes",
        choices=("auto", "fork", "forkserver", "spawn"),
    ),
    Field(
        "mixed_precision",
        "str",
        "no",
        "Mixed precision passed to Accelerate (ACCELERATE_MIXED_PRECISION).",
        "precision",
        choices=MIXED_PRECISION,
        accelerate=True,
    ),
    Field(
        "downcast_bf16",
        "bool",
        False,
        "Accelerate: downcast bf16 results to fp32 (TPU only).",
        "precision",
        accelerate=True,
    ),
    Field(
        "output",
        "str",
        "rank0",
        "Which ranks' output shows in the cell: rank0, all (prefixed [rank N]) or none.",
        "output",
        choices=("rank0", "all", "none"),
    ),
    Field(
        "progress", "str", "rank0", "Which ranks' progress bars show: rank0 or all.", "output", choices=("rank0", "all")
    ),
    Field(
        "metrics",
        "str",
        "on",
        "on: what Accelerate, Trainer, Lightning and TensorBoard log draws the live chart; off: only log_metrics().",
        "output",
        choices=("on", "off"),
    ),
    Field(
        "log_dir",
        "str",
        None,
        "Folder for per-rank log files. Empty: a folder under the system temp dir.",
        "output",
        nullable=True,
    ),
    Field(
        "timeout",
        "float",
        None,
        "Stop the run after this many seconds. Empty: no limit.",
        "run",
        nullable=True,
        minimum=0,
        above_minimum=True,
    ),
    Field(
        "main_process_port",
        "int",
        None,
        "Rendezvous port. Empty or taken: a free port is chosen.",
        "run",
        nullable=True,
        minimum=1,
        maximum=65535,
        accelerate=True,
    ),
    Field("env", "dict", {}, "Extra environment variables for every worker.", "run"),
    Field(
        "num_machines",
        "int",
        1,
        "Number of machines. More than 1: every machine runs the same cell, joined by torch's elastic launcher.",
        "machines",
        minimum=1,
        accelerate=True,
    ),
    Field("machine_rank", "int", 0, "This machine's rank among num_machines.", "machines", minimum=0, accelerate=True),
    Field(
        "main_process_ip",
        "str",
        None,
        "Address (IP or host name) of machine 0, which every machine can reach (multi-machine only).",
        "machines",
        nullable=True,
        accelerate=True,
    ),
    Field(
        "rdzv_backend",
        "str",
        "static",
        "Rendezvous backend (multi-machine only): c10d (torchrun's default) or static (needs machine_rank).",
        "machines",
        choices=("static", "c10d"),
        accelerate=True,
    ),
    Field(
        "engine",
        "str",
        "local",
        "Where workers run: local (this machine's processes) or ray (Ray Train on the cluster at ray_address).",
        "machines",
        choices=("local", "ray"),
    ),
    Field(
        "ray_address",
        "str",
        "local",
        "Ray cluster for engine: ray: 'local' (a Ray started for this kernel), 'auto', 'HOST:PORT' or "
        "'ray://HOST:PORT'.",
        "machines",
    ),
    Field("use_gpu", "bool", False, "engine: ray: give each worker a GPU.", "machines"),
    Field(
        "resources_per_worker",
        "dict",
        {},
        "engine: ray: Ray resources per worker, e.g. {CPU: 2}.",
        "machines",
    ),
    Field(
        "placement_strategy",
        "str",
        "pack",
        "engine: ray: how the ranks' bundles are placed on nodes (Ray's placement strategies, as Ray Train's "
        "ScalingConfig): pack (as few nodes as they fit on), spread (as many nodes as there are), strict_pack (one "
        "whole node for every rank), strict_spread (one rank on each node).",
        "machines",
        choices=("pack", "spread", "strict_pack", "strict_spread"),
    ),
    Field(
        "same_network", "bool", True, "Accelerate: all machines are on the same network.", "machines", accelerate=True
    ),
    Field(
        "dynamo_config",
        "dict",
        {},
        "Accelerate dynamo settings (dynamo_backend, dynamo_mode, ...).",
        "advanced",
        accelerate=True,
    ),
    Field(
        "fsdp_config",
        "dict",
        {},
        "Accelerate FSDP settings (fsdp_version, fsdp_sharding_strategy, ...).",
        "advanced",
        accelerate=True,
    ),
    Field(
        "deepspeed_config", "dict", {}, "Accelerate DeepSpeed settings (zero_stage, ...).", "advanced", accelerate=True
    ),
    Field("debug", "bool", False, "Accelerate debug mode (checks collective shapes).", "advanced", accelerate=True),
    Field(
        "fp8_config",
        "dict",
        {},
        "Accelerate fp8 settings for mixed_precision fp8 (backend, fp8_format, amax_history_len, ...).",
        "advanced",
        accelerate=True,
    ),
    Field(
        "megatron_lm_config",
        "dict",
        {},
        "Accelerate Megatron-LM settings (megatron_lm_tp_degree, ...); needs GPUs.",
        "advanced",
        accelerate=True,
    ),
    Field(
        "parallelism_config",
        "dict",
        {},
        "Accelerate parallelism settings with FSDP 2 (parallelism_config_dp_shard_size, ...).",
        "advanced",
        accelerate=True,
    ),
    Field(
        "enable_cpu_affinity",
        "bool",
        False,
        "Accelerate: pin each rank to the CPU cores of its NUMA node (ACCELERATE_CPU_AFFINITY).",
        "advanced",
        accelerate=True,
    ),
)
FIELDS_BY_NAME = {f.name: f for f in FIELDS}

# Accelerate keys that describe its launcher rather than the run; read and written back
# so a round trip loses nothing, but not shown as nblaunch settings.
ACCELERATE_PASSTHROUGH = {
    "compute_environment",
    "distributed_type",
    "main_training_function",
    "tpu_env",
    "tpu_use_cluster",
    "tpu_use_sudo",
    "mpirun_config",  # nblaunch starts the ranks itself, never through mpirun
}


def schema() -> list[dict]:
    """The schema as JSON-ready dicts, in display order (served to the side panel)."""
    return [f.to_json() for f in FIELDS]


def defaults() -> dict:
    return {f.name: copy_value(f.default) for f in FIELDS}


def copy_value(v):
    """A default's own copy, so that a caller's change never reaches the schema."""
    return dict(v) if isinstance(v, dict) else list(v) if isinstance(v, list) else v
