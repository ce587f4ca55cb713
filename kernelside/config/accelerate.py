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

from ..errors import LaunchConfigError
from .bounded_yaml import load_yaml, read_config_text
from .field_checks import check_value
from .fields import FIELDS_BY_NAME, defaults
from .files import ConfigFile, accelerate_default_config_path

default_config_path = accelerate_default_config_path  # Accelerate's own name for it


def import_accelerate(path_or_text: str | os.PathLike, *, text: bool = False) -> ConfigFile:
    """Read an Accelerate config (overlapping keys become nblaunch values)."""
    where = None if text else Path(path_or_text)
    raw = str(path_or_text) if text else read_config_text(where)
    data = load_yaml(raw, f"Accelerate config {where}" if where else "Accelerate config", where) or {}
    if not isinstance(data, dict):
        where_text = f"Accelerate config {where}" if where else "an Accelerate config"
        message = f"{where_text} must be a mapping of keys to values"
        raise LaunchConfigError(None, None, None, path=where, message=message)
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
    # Accelerate reads a plugin's settings only under its distributed_type: a leftover fsdp_config in a
    # MULTI_GPU file must not turn FSDP on here. Kept aside, so a round trip loses nothing.
    kind = data.get("distributed_type")
    for key, owner in _PLUGIN_KEYS.items():
        if values.get(key) and kind is not None and kind != owner:
            unknown[key] = values.pop(key)
            warnings.append(f"{key}: ignored, as Accelerate does, because distributed_type is {kind}, not {owner}")
    return ConfigFile(where, values, unknown, warnings, invalid)


# the config key of each plugin, and the distributed_type under which Accelerate reads it
_PLUGIN_KEYS = {"fsdp_config": "FSDP", "deepspeed_config": "DEEPSPEED", "megatron_lm_config": "MEGATRON_LM"}


def distributed_type(values: dict) -> str:
    """The ``distributed_type`` of Accelerate's config file for these values (a plugin's settings choose it).

    Example::

        >>> distributed_type({"num_processes": 2, "use_cpu": True, "deepspeed_config": {"zero_stage": 2}})
        'DEEPSPEED'
    """
    v = {**defaults(), **{k: x for k, x in values.items() if k in FIELDS_BY_NAME}}
    for key, kind in _PLUGIN_KEYS.items():
        if v[key]:
            return kind  # as with accelerate launch, DeepSpeed on CPU is still DeepSpeed
    several = (v["num_processes"] or 1) > 1 or v["num_machines"] > 1
    if v["use_cpu"]:
        return "MULTI_CPU" if several else "NO"
    return "MULTI_GPU" if several else "NO"


def export_accelerate(values: dict) -> dict:
    """A mapping that ``accelerate launch --config_file`` accepts, for this config."""
    v = {**defaults(), **{k: x for k, x in values.items() if k in FIELDS_BY_NAME}}
    n = v["num_processes"] or 1
    dist_type = distributed_type(v)
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
    if dist_type == "DEEPSPEED" and v["deepspeed_config"].get("deepspeed_config_file") and v["mixed_precision"] == "no":
        del out["mixed_precision"]  # Accelerate refuses a DeepSpeed config file beside any mixed_precision key
    if v["main_process_ip"]:
        out["main_process_ip"] = v["main_process_ip"]
    if v["main_process_port"]:
        out["main_process_port"] = v["main_process_port"]
    if v["enable_cpu_affinity"]:
        out["enable_cpu_affinity"] = True
    for k in ("dynamo_config", "fp8_config", "parallelism_config", *_PLUGIN_KEYS):
        if v[k] and (k not in _PLUGIN_KEYS or _PLUGIN_KEYS[k] == dist_type):
            out[k] = v[k]
    return out
