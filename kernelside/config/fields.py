"""The schema of the launch configuration: every key, its type, default, allowed values and help, as
the server extension and the panel show it (``launch_rules.py`` has the names and defaults every
launch path shares).

Example::

    >>> check_value("num_processes", "4")
    4
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

from ..errors import LaunchConfigError


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
_HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?|\[?[0-9A-Fa-f:]+\]?")
_RAY_ADDRESS = re.compile(r"(ray://)?[A-Za-z0-9.\-\[\]:]+:[0-9]+")

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
    return {f.name: _copy(f.default) for f in FIELDS}


def _copy(v):
    return dict(v) if isinstance(v, dict) else list(v) if isinstance(v, list) else v


def _allowed(f: Field) -> str:
    if f.choices:
        return "one of " + ", ".join(repr(c) for c in f.choices)
    base = {
        "int": "an integer",
        "float": "a number",
        "bool": "true or false",
        "str": "a string",
        "dict": "a mapping",
        "list": "a list",
    }[f.type]
    if f.minimum is not None and f.maximum is not None:
        base += f" from {f.minimum:g} to {f.maximum:g}"
    elif f.minimum is not None:
        base += f" {'>' if f.above_minimum else '>='} {f.minimum:g}"
    elif f.maximum is not None:
        base += f" <= {f.maximum:g}"
    return base + (" or empty" if f.nullable else "")


def allowed(name: str) -> str:
    """What the schema allows for ``name``, in words (``allowed("main_process_port")`` → 'an integer from 1 to
    65535 or empty'): the text every refusal of a bad value ends with."""
    return _STRING_RULES[name][1] if name in _STRING_RULES else _allowed(FIELDS_BY_NAME[name])


def _gpu_ids(v: str) -> bool:
    return v == "all" or all(p.isdigit() for p in v.split(","))


def _path(v: str) -> bool:
    # Checked as text only: the folder is made at launch, relative to the kernel's working directory.
    return bool(v.strip()) and "\x00" not in v


# Strings with a shape beyond their type: the rule and the words that say what is allowed.
_STRING_RULES = {
    "gpu_ids": (_gpu_ids, "'all' or comma-separated GPU indices such as '0,1'"),
    "main_process_ip": (_HOST.fullmatch, "an IP address or host name without port, e.g. 10.0.0.1"),
    "ray_address": (
        lambda v: v in ("local", "auto") or _RAY_ADDRESS.fullmatch(v),
        "'local', 'auto', 'HOST:PORT' or 'ray://HOST:PORT'",
    ),
    "log_dir": (_path, "a folder path (not blank, no NUL character) or empty"),
}


def _env_name(k) -> bool:
    return isinstance(k, str) and bool(k) and "=" not in k and "\x00" not in k


def check_value(name: str, value: Any) -> Any:
    """Validate and normalise one value; raise LaunchConfigError naming key, value and what is allowed."""
    f = FIELDS_BY_NAME.get(name)
    if f is None:
        raise LaunchConfigError(name, value, "a known key: " + ", ".join(FIELDS_BY_NAME))
    if value is None:
        if f.nullable:
            return None
        if f.type in ("dict", "list"):
            return _copy(f.default)
        raise LaunchConfigError(name, value, _allowed(f))
    v = value
    if f.type == "int":
        if isinstance(v, str) and v.strip().lstrip("-").isdigit():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int):
            raise LaunchConfigError(name, value, _allowed(f))
    elif f.type == "float":
        if isinstance(v, str):
            try:
                v = float(v)
            except ValueError:
                raise LaunchConfigError(name, value, _allowed(f)) from None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise LaunchConfigError(name, value, _allowed(f))
        v = float(v)
    elif f.type == "bool":
        if isinstance(v, str) and v.lower() in ("true", "false", "yes", "no", "1", "0"):
            v = v.lower() in ("true", "yes", "1")
        if not isinstance(v, bool):
            raise LaunchConfigError(name, value, _allowed(f))
    elif f.type == "str":
        if name == "metrics" and isinstance(v, bool):  # YAML reads a bare `metrics: off` as false
            v = "on" if v else "off"
        if name == "gpu_ids" and isinstance(v, int) and not isinstance(v, bool):
            v = str(v)
        if name == "gpu_ids" and isinstance(v, (list, tuple)):
            v = ",".join(str(i) for i in v)
        if not isinstance(v, str):
            raise LaunchConfigError(name, value, allowed(name))
        if f.choices and v not in f.choices:
            raise LaunchConfigError(name, value, _allowed(f))
        if name == "gpu_ids":
            v = v.replace(" ", "")
        rule = _STRING_RULES.get(name)
        if rule is not None and not rule[0](v):
            raise LaunchConfigError(name, value, rule[1])
    elif f.type == "list":
        if not isinstance(v, (list, tuple)):
            raise LaunchConfigError(name, value, _allowed(f))
        v = list(v)
    elif f.type == "dict":
        if not isinstance(v, dict):
            raise LaunchConfigError(name, value, _allowed(f))
        if name == "env":
            if not all(_env_name(k) for k in v):
                raise LaunchConfigError(name, value, "a mapping of variable names (no '=' in them) to values")
            v = {str(k): str(val) for k, val in v.items()}
        if name == "resources_per_worker":
            bad = [k for k, n in v.items() if isinstance(n, bool) or not isinstance(n, (int, float)) or n < 0]
            if bad:
                raise LaunchConfigError(name, value, "a mapping of resource name to a number >= 0, e.g. {CPU: 2}")
    if f.minimum is not None and (v <= f.minimum if f.above_minimum else v < f.minimum):
        raise LaunchConfigError(name, value, _allowed(f))
    if f.maximum is not None and v > f.maximum:
        raise LaunchConfigError(name, value, _allowed(f))
    return v


def validate(values: dict) -> tuple[dict, dict[str, str]]:
    """Check every known key. Returns (normalised values, {key: error message})."""
    good, errors = {}, {}
    for k, v in values.items():
        if k not in FIELDS_BY_NAME:
            continue
        try:
            good[k] = check_value(k, v)
        except LaunchConfigError as e:
            errors[k] = e.allowed_message
    return good, errors
