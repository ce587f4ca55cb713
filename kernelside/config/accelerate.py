"""Accelerate's config files: where ``accelerate config`` writes one, and conversion both ways.

``import_accelerate`` reads the keys that mean the same in both (``num_processes``,
``mixed_precision``, ``gpu_ids``, ...) and keeps the rest aside; ``export_accelerate`` writes a
mapping that ``accelerate launch --config_file`` accepts.

Example::

    >>> export_accelerate({"num_processes": 2, "use_cpu": True})["distributed_type"]
    'MULTI_CPU'
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from ..errors import LaunchConfigError
from .fields import FIELDS_BY_NAME, check_value, defaults
from .files import ConfigFile, accelerate_default_config_path

default_config_path = accelerate_default_config_path  # Accelerate's own name for it


def import_accelerate(path_or_text: str | os.PathLike, *, text: bool = False) -> ConfigFile:
    """Read an Accelerate config (overlapping keys become nblaunch values)."""
    raw = str(path_or_text) if text else Path(path_or_text).read_text()
    where = None if text else Path(path_or_text)
    try:
        data = yaml.safe_load(raw) or {}
    except yaml.YAMLError as e:
        raise LaunchConfigError(None, None, None, message=f"Accelerate config is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise LaunchConfigError(None, None, None, message="Accelerate config must be a mapping")
    values, unknown, warnings, invalid = {}, {}, [], {}
    for k, v in data.items():
        f = FIELDS_BY_NAME.get(k)
        if f is not None and f.accelerate:
            if k == "num_processes" and v in (-1, "-1"):
                continue  # Accelerate writes -1 for "decide at launch"
            try:
                values[k] = check_value(k, v)
            except LaunchConfigError as e:
                e.path, e.source = where, e.source or "an Accelerate config"
                invalid[k] = e
        else:
            unknown[k] = v
    if data.get("distributed_type") == "MULTI_CPU" or data.get("use_cpu"):
        values["use_cpu"] = True
    return ConfigFile(where, values, unknown, warnings, invalid)


def export_accelerate(values: dict) -> dict:
    """A mapping that ``accelerate launch --config_file`` accepts, for this config."""
    v = {**defaults(), **{k: x for k, x in values.items() if k in FIELDS_BY_NAME}}
    n = v["num_processes"] or 1
    if v["use_cpu"]:
        dist_type = "MULTI_CPU" if n > 1 or v["num_machines"] > 1 else "NO"
    elif v["fsdp_config"]:
        dist_type = "FSDP"
    elif v["deepspeed_config"]:
        dist_type = "DEEPSPEED"
    else:
        dist_type = "MULTI_GPU" if n > 1 or v["num_machines"] > 1 else "NO"
    out = {
        "compute_environment": "LOCAL_MACHINE",
        "debug": v["debug"],
        "distributed_type": dist_type,
        "downcast_bf16": "no" if not v["downcast_bf16"] else "yes",
        "gpu_ids": v["gpu_ids"],
        "machine_rank": v["machine_rank"],
        "main_training_function": "main",
        "mixed_precision": v["mixed_precision"],
        "num_machines": v["num_machines"],
        "num_processes": n,
        "rdzv_backend": v["rdzv_backend"],
        "same_network": v["same_network"],
        "tpu_env": [],
        "tpu_use_cluster": False,
        "tpu_use_sudo": False,
        "use_cpu": v["use_cpu"],
    }
    if v["main_process_ip"]:
        out["main_process_ip"] = v["main_process_ip"]
    if v["main_process_port"]:
        out["main_process_port"] = v["main_process_port"]
    for k in ("dynamo_config", "fsdp_config", "deepspeed_config"):
        if v[k]:
            out[k] = v[k]
    return out
