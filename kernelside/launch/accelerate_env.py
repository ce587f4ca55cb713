"""The ``ACCELERATE_*`` / ``FSDP_*`` environment of a launch: what ``accelerate launch`` exports for the same config.

nblaunch does not re-derive Accelerate's variables: it asks Accelerate's own launcher. The launch's configuration is
written as the Accelerate config file ``export_accelerate()`` makes (the one the panel exports), read by
``accelerate launch``'s own argument parser and validation, and given to the ``accelerate.utils.launch`` function
``accelerate launch`` would call for it (``prepare_deepspeed_cmd_env``, ``prepare_multi_gpu_env`` or
``prepare_simple_launcher_cmd_env``). The variables under ``PREFIXES`` that it adds are what every rank gets, so a
release of Accelerate that adds or renames one reaches the ranks unchanged (and ``tests/test_accelerate_env.py``,
which runs the real ``accelerate launch`` beside nblaunch, says so).

What Accelerate itself refuses (fp8 without an fp8 backend, an unknown dynamo backend...) and what it would silently
drop on this machine (DeepSpeed not installed, FSDP or Megatron-LM without GPUs) fail here, before anything starts.

Example::

    >>> env = accelerate_env(resolve_config({"num_processes": 2, "mixed_precision": "bf16"}).values, use_cpu=True)
    >>> env["ACCELERATE_USE_CPU"], env["ACCELERATE_MIXED_PRECISION"]
    ('True', 'bf16')
"""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
import os
import tempfile
import warnings

import yaml

from ..config.accelerate import distributed_type, export_accelerate
from ..config.bounded_yaml import read_config_text
from ..errors import LaunchConfigError
from . import hardware

PREFIXES = ("ACCELERATE_", "FSDP_", "MEGATRON_LM_", "PARALLELISM_CONFIG_")
_NOTHING = "Nothing was started."
# Keys only Accelerate reads: set while Accelerate is missing, nothing in a rank would act on them.
_ACCELERATE_ONLY = ("deepspeed_config", "fsdp_config", "megatron_lm_config", "parallelism_config", "fp8_config")


def accelerate_env(values: dict, use_cpu: bool) -> dict:
    """The variables ``accelerate launch`` exports for this config, on a machine where the ranks use CPU or not.

    Raises LaunchConfigError for what Accelerate refuses, or would silently replace on this machine.
    """
    dist = distributed_type({**values, "use_cpu": use_cpu})
    if importlib.util.find_spec("accelerate") is None:
        return _without_accelerate(values, use_cpu)
    refuse_silent_fallbacks(values, dist, use_cpu)
    exported = yaml.safe_dump(export_accelerate({**values, "use_cpu": use_cpu or values["use_cpu"]}))
    inherited = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(PREFIXES)))
    launcher, env = _launch_env_for(exported, inherited)
    env = dict(env)
    inherited_cpu = os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes", "y", "on")
    if launcher == "deepspeed" and "ACCELERATE_USE_CPU" not in env and inherited_cpu:
        raise LaunchConfigError(
            "deepspeed_config",
            values.get("deepspeed_config"),
            None,
            message="DeepSpeed is configured, but this kernel's environment has ACCELERATE_USE_CPU="
            f"{os.environ['ACCELERATE_USE_CPU']}, which the ranks would inherit and which makes Accelerate ignore "
            "DeepSpeed (it would train with DDP instead). Remove it (del os.environ['ACCELERATE_USE_CPU']) and "
            f"launch again. {_NOTHING}",
        )
    return env


@functools.lru_cache(maxsize=16)
def _launch_env_for(config_text: str, inherited: tuple) -> tuple[str, dict]:
    """``launch_env`` of this config file text, given these inherited variables (which the result leaves out).
    Cached because it is a pure function of both and costs tens of ms: a notebook relaunches the same config."""
    with tempfile.TemporaryDirectory(prefix="nblaunch-accelerate-") as d:
        path = os.path.join(d, "accelerate_config.yaml")
        with open(path, "w") as fh:
            fh.write(config_text)
        return launch_env(path)


def launch_env(config_file: str) -> tuple[str, dict]:
    """``(launcher, variables)``: which launcher ``accelerate launch --config_file F`` picks ("deepspeed",
    "multi_gpu" or "simple"), and the variables under ``PREFIXES`` it sets for the ranks, computed by its own code."""
    from accelerate.commands import launch as acc_launch
    from accelerate.utils import launch as acc_utils

    args = acc_launch.launch_command_parser().parse_args(["--config_file", config_file, "nblaunch_rank.py"])
    quiet = logging.getLogger(acc_launch.__name__)
    was_disabled, quiet.disabled = quiet.disabled, True  # its "defaults were used" advice is for its CLI users
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "port already in use": nblaunch picks its own port
            args, defaults, mp_from_config = acc_launch._validate_launch_command(args)
            # launch_command()'s choice of launcher, in its order
            if args.use_deepspeed and not args.cpu:
                fields = list(defaults.deepspeed_config) if defaults else []
                if mp_from_config:
                    fields.append("mixed_precision")
                args.deepspeed_fields_from_accelerate_config = ",".join(fields)
                launcher, (_, env) = "deepspeed", acc_utils.prepare_deepspeed_cmd_env(args)
            elif (args.use_fsdp or args.use_megatron_lm or args.multi_gpu) and not args.cpu:
                launcher, env = "multi_gpu", acc_utils.prepare_multi_gpu_env(args)
            else:
                launcher, (_, env) = "simple", acc_utils.prepare_simple_launcher_cmd_env(args)
    except (ValueError, RuntimeError, ImportError, AssertionError) as e:
        raise LaunchConfigError(
            None, None, None, message=f"Accelerate refuses this configuration: {e} {_NOTHING}"
        ) from None
    finally:
        quiet.disabled = was_disabled
    return launcher, {k: v for k, v in env.items() if k.startswith(PREFIXES) and os.environ.get(k) != v}


def refuse_silent_fallbacks(values: dict, dist: str, use_cpu: bool) -> None:
    """Raise where the ranks would not run what the config says: DeepSpeed missing, FSDP or Megatron-LM without GPUs
    (Accelerate runs both only on accelerators; on CPU it would train with DDP, or not distributed at all)."""
    plugins = [k for k in ("fsdp_config", "deepspeed_config", "megatron_lm_config") if values.get(k)]
    if len(plugins) > 1:
        raise LaunchConfigError(
            plugins[1],
            values[plugins[1]],
            None,
            message=f"{' and '.join(plugins)} are both set, but Accelerate runs one of them (an Accelerate config "
            f"file has one distributed_type); {plugins[0]} would win and the other be ignored. Keep one. {_NOTHING}",
        )
    if dist == "DEEPSPEED" and importlib.util.find_spec("deepspeed") is None:
        raise LaunchConfigError(
            "deepspeed_config",
            values.get("deepspeed_config"),
            None,
            message="deepspeed_config is set, but DeepSpeed is not installed in this kernel's Python, so Accelerate "
            "could not run it. Install it (pip install deepspeed), or remove deepspeed_config to train with DDP. "
            + _NOTHING,
        )
    if dist == "DEEPSPEED":
        _refuse_what_deepspeed_refuses(values, use_cpu)
    if use_cpu and dist in ("FSDP", "MEGATRON_LM"):
        key = "fsdp_config" if dist == "FSDP" else "megatron_lm_config"
        why = "this machine has no GPU" if not values["use_cpu"] else "use_cpu is set"
        raise LaunchConfigError(
            key,
            values.get(key),
            None,
            message=f"{key} is set, but the ranks compute on CPU ({why}), where Accelerate does not run "
            f"{'FSDP' if dist == 'FSDP' else 'Megatron-LM'}: Accelerator() would train without it. Run on GPUs, or "
            f"remove {key}. (torch's own FSDP, fully_shard() in the cell, does run on CPU.) {_NOTHING}",
        )


def _refuse_what_deepspeed_refuses(values: dict, use_cpu: bool) -> None:
    """A DeepSpeed config file that is missing, or fp16 on a CPU where DeepSpeed's CPU accelerator has none: the ranks
    would fail in ``accelerator.prepare()`` after starting everything; say it now."""
    ds = values.get("deepspeed_config") or {}
    path, ds_file = ds.get("deepspeed_config_file"), {}
    if path:
        try:  # within the config files' limits: size, text, and json's own bound on nesting
            ds_file = json.loads(read_config_text(path))
            if not isinstance(ds_file, dict):
                raise ValueError(f"it holds a JSON {type(ds_file).__name__}, not an object")
        except (ValueError, RecursionError) as e:
            reason = "it nests deeper than JSON can be read" if isinstance(e, RecursionError) else e
            raise LaunchConfigError(
                "deepspeed_config",
                ds,
                None,
                message=f"deepspeed_config_file {path!r} cannot be read as JSON from {os.getcwd()} ({reason}). Give a "
                f"path to DeepSpeed's JSON config, absolute or relative to the notebook's folder. {_NOTHING}",
            ) from None
    fp16_section = ds_file.get("fp16")
    fp16 = values["mixed_precision"] == "fp16" or (
        isinstance(fp16_section, dict) and fp16_section.get("enabled") is True
    )
    if use_cpu and fp16 and not hardware.cpu_has_fp16_kernels():
        raise LaunchConfigError(
            "mixed_precision",
            "fp16",
            None,
            message="DeepSpeed on CPU runs fp16 only where oneDNN has fp16 kernels, and this CPU has none "
            "(torch.ops.mkldnn._is_mkldnn_fp16_supported() is False): every rank would stop in prepare() with "
            f"'Type fp16 is not supported on your device'. Use mixed_precision bf16 or no. {_NOTHING}",
        )


def _without_accelerate(values: dict, use_cpu: bool) -> dict:
    """No Accelerate in this Python: nothing in a rank reads these, except that its own keys would be silently lost."""
    for key in _ACCELERATE_ONLY:
        if values.get(key):
            raise LaunchConfigError(
                key,
                values[key],
                None,
                message=f"{key} is set, but Accelerate is not installed in this kernel's Python, so nothing in the "
                f"ranks would read it. Install accelerate, or remove {key}. {_NOTHING}",
            )
    env = {"ACCELERATE_MIXED_PRECISION": values["mixed_precision"]}
    if use_cpu:
        env["ACCELERATE_USE_CPU"] = "True"
    return env
