"""A rank sees exactly the ACCELERATE_* / FSDP_* variables that `accelerate launch` exports for the same config file.

Table-driven: each row is an Accelerate config file; together they cover every key `accelerate launch` reads from
one (mixed precision and fp8, dynamo, debug, cpu, cpu affinity, downcast_bf16, DeepSpeed's plugin keys and a
DeepSpeed config file, gradient accumulation and clipping, ZeRO-3 init and 16-bit save, offload devices, MoE layer
classes, FSDP v1 and v2, parallelism, Megatron-LM). The expected side is the real `accelerate launch --config_file F`
running a script that writes down its environment; nblaunch's side is what its ranks see for the same file. A new
Accelerate release that adds or renames a variable fails here.

Rows whose plugin Accelerate runs only on GPUs (FSDP, Megatron-LM) are refused on this CPU machine before anything
starts (asserted); their variables are compared from the launch plan for a 2-GPU machine, which is what the ranks
would get there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from kernelside import notebook_launcher
from kernelside.config import resolve_config
from kernelside.errors import LaunchConfigError
from kernelside.launch.accelerate_env import PREFIXES
from kernelside.launch.plan import make_plan

DUMP = f"""
import json, os, sys
PREFIXES = {PREFIXES!r}
keep = {{k: v for k, v in os.environ.items() if k.startswith(PREFIXES)}}
with open(os.path.join(sys.argv[1], "env_" + os.environ.get("RANK", "0") + ".json"), "w") as fh:
    json.dump(keep, fh)
"""

BASE = {"compute_environment": "LOCAL_MACHINE", "num_machines": 1, "machine_rank": 0, "num_processes": 2}
DS_FILE = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, "zero_optimization": {"stage": 2}}

# name -> (config file, where nblaunch's side is read: "ranks" (this CPU machine) or "plan" (a 2-GPU machine))
ROWS = {
    "multi_cpu_precision_dynamo_debug_affinity_downcast": (
        {
            "distributed_type": "MULTI_CPU",
            "use_cpu": True,
            "mixed_precision": "bf16",
            "debug": True,
            "enable_cpu_affinity": True,
            "downcast_bf16": "yes",
            "dynamo_config": {
                "dynamo_backend": "INDUCTOR",
                "dynamo_mode": "max-autotune",
                "dynamo_use_fullgraph": True,
                "dynamo_use_dynamic": True,
                "dynamo_use_regional_compilation": True,
            },
            "fp8_config": {"backend": "TE", "fp8_format": "HYBRID"},  # read only with mixed_precision fp8
        },
        "ranks",
    ),
    "deepspeed_plugin_keys": (
        {
            "distributed_type": "DEEPSPEED",
            "mixed_precision": "bf16",
            "deepspeed_config": {
                "zero_stage": 3,
                "gradient_accumulation_steps": 4,
                "gradient_clipping": 1.0,
                "offload_optimizer_device": "cpu",
                "offload_param_device": "cpu",
                "zero3_init_flag": True,
                "zero3_save_16bit_model": True,
                "deepspeed_moe_layer_cls_names": "MixtralSparseMoeBlock",
            },
        },
        "ranks",
    ),
    "deepspeed_config_file": (
        {
            "distributed_type": "DEEPSPEED",
            "deepspeed_config": {"deepspeed_config_file": "ds.json", "zero3_init_flag": False},
        },
        "ranks",
    ),
    "single_process_gpu_machine": ({"distributed_type": "NO", "num_processes": 1, "mixed_precision": "fp16"}, "plan"),
    "fsdp_v1_every_key": (
        {
            "distributed_type": "FSDP",
            "mixed_precision": "bf16",
            "fsdp_config": {
                "fsdp_version": 1,
                "fsdp_sharding_strategy": "SHARD_GRAD_OP",
                "fsdp_offload_params": True,
                "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                "fsdp_transformer_layer_cls_to_wrap": "BertLayer",
                "fsdp_backward_prefetch": "BACKWARD_PRE",
                "fsdp_state_dict_type": "FULL_STATE_DICT",
                "fsdp_forward_prefetch": True,
                "fsdp_use_orig_params": False,
                "fsdp_cpu_ram_efficient_loading": True,
                "fsdp_sync_module_states": True,
                "fsdp_activation_checkpointing": True,
                "fsdp_min_num_params": 1000,
            },
        },
        "plan",
    ),
    "fsdp_v2_parallelism": (
        {
            "distributed_type": "FSDP",
            "fsdp_config": {
                "fsdp_version": 2,
                "fsdp_reshard_after_forward": False,
                "fsdp_auto_wrap_policy": "SIZE_BASED_WRAP",
                "fsdp_min_num_params": 2000,
                "fsdp_state_dict_type": "SHARDED_STATE_DICT",
                "fsdp_activation_checkpointing_offload": True,
                "fsdp_cpu_ram_efficient_loading": False,
                "fsdp_ignored_modules": "lm_head",
            },
            "parallelism_config": {
                "parallelism_config_dp_replicate_size": 1,
                "parallelism_config_dp_shard_size": 2,
                "parallelism_config_tp_size": 1,
                "parallelism_config_cp_size": 1,
            },
        },
        "plan",
    ),
    "megatron_lm": (
        {
            "distributed_type": "MEGATRON_LM",
            "megatron_lm_config": {
                "megatron_lm_tp_degree": 2,
                "megatron_lm_pp_degree": 1,
                "megatron_lm_num_micro_batches": 2,
                "megatron_lm_gradient_clipping": 1.0,
                "megatron_lm_sequence_parallelism": True,
                "megatron_lm_recompute_activations": True,
                "megatron_lm_use_distributed_optimizer": True,
            },
        },
        "plan",
    ),
}


def report_env():
    return {k: v for k, v in os.environ.items() if k.startswith(PREFIXES)}


@pytest.fixture(scope="module")
def configs(starts_processes, tmp_path_factory):
    """Every row's file, and what the real `accelerate launch` exported for it (all launched at once)."""
    root = tmp_path_factory.mktemp("accelerate_env")
    (root / "dump.py").write_text(DUMP)
    (root / "ds.json").write_text(json.dumps(DS_FILE))
    env = {k: v for k, v in os.environ.items() if not k.startswith(PREFIXES)}
    env.update(HF_HOME=str(root / "hf"), OMP_NUM_THREADS="1")
    runs, files = {}, {}
    for port, (name, (cfg, _)) in enumerate(ROWS.items(), start=29700):
        files[name] = root / f"{name}.yaml"
        files[name].write_text(yaml.safe_dump({**BASE, "main_process_port": port, **cfg}))
        out = root / name
        out.mkdir()
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(files[name]), "dump.py"]
        cmd.append(str(out))
        runs[name] = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    expected = {}
    for name, proc in runs.items():
        output = proc.communicate(timeout=240)[0].decode(errors="replace")
        assert proc.returncode == 0, f"accelerate launch failed for {name}:\n{output[-3000:]}"
        dumps = sorted((root / name).glob("env_*.json"))
        envs = [json.loads(p.read_text()) for p in dumps]
        assert envs and all(e == envs[0] for e in envs), f"{name}: ranks of accelerate launch differ: {envs}"
        expected[name] = envs[0]
    return root, files, expected


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    for k in list(os.environ):
        if k.startswith(PREFIXES):
            monkeypatch.delenv(k)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.delenv("NBLAUNCH_CONFIG", raising=False)


@pytest.mark.parametrize("name", [n for n, (_, where) in ROWS.items() if where == "ranks"])
def test_ranks_see_exactly_what_accelerate_launch_exports_for_the_same_file(name, configs, clean_env, monkeypatch):
    root, files, expected = configs
    monkeypatch.chdir(root)  # the DeepSpeed config file's relative path, as accelerate launch resolves it
    seen = notebook_launcher(report_env, num_processes=2, config=str(files[name]), return_all=True)
    assert seen[0] == seen[1]
    assert seen[0] == expected[name]


@pytest.mark.parametrize("name", [n for n, (_, where) in ROWS.items() if where == "plan"])
def test_gpu_machine_plan_gives_exactly_what_accelerate_launch_exports(name, configs, clean_env):
    _, files, expected = configs
    plan = make_plan(resolve_config({}, config=str(files[name])), gpus=2, cuda_initialized=False)
    got = {k: v for k, v in plan.env_for(0, 29500).items() if k.startswith(PREFIXES)}
    assert got == expected[name]


@pytest.mark.parametrize("name,key", [("fsdp_v1_every_key", "fsdp_config"), ("megatron_lm", "megatron_lm_config")])
def test_gpu_only_plugins_are_refused_on_cpu_before_anything_starts(name, key, configs, clean_env):
    _, files, _ = configs
    with pytest.raises(LaunchConfigError, match=f"{key} is set, but the ranks compute on CPU .*Nothing was started"):
        notebook_launcher(report_env, num_processes=2, config=str(files[name]))


@pytest.mark.processes
def test_fp8_without_an_fp8_backend_is_refused_as_accelerate_launch_refuses_it(tmp_path, clean_env):
    cfg = tmp_path / "fp8.yaml"
    cfg.write_text(yaml.safe_dump({**BASE, "distributed_type": "MULTI_CPU", "use_cpu": True, "mixed_precision": "fp8"}))
    (tmp_path / "noop.py").write_text("pass\n")
    run = subprocess.run(
        [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(cfg), str(tmp_path / "noop.py")],
        capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert run.returncode != 0 and "FP8 is not available on this machine" in run.stderr
    with pytest.raises(LaunchConfigError, match="Accelerate refuses this configuration: FP8 is not available"):
        notebook_launcher(report_env, num_processes=2, config=str(cfg))


def test_the_rows_cover_every_key_accelerate_launch_reads_from_a_config_file():
    """A key of Accelerate's config dataclass that no row sets is a key whose variables nobody compared."""
    from accelerate.commands.config.config_args import ClusterConfig

    launcher_only = {
        "compute_environment", "distributed_type", "main_training_function", "machine_rank", "num_machines",
        "num_processes", "main_process_ip", "main_process_port", "rdzv_backend", "same_network", "gpu_ids",
        "mpirun_config",  # nblaunch starts the ranks itself
        "tpu_name", "tpu_zone", "tpu_use_cluster", "tpu_use_sudo", "command_file", "commands", "tpu_vm", "tpu_env",
    }  # fmt: skip
    covered = set(BASE) | {k for cfg, _ in ROWS.values() for k in cfg}
    assert set(ClusterConfig.__dataclass_fields__) - launcher_only - covered == set()


def test_deepspeed_in_nblaunch_yaml_gives_the_variables_of_the_same_accelerate_file(configs, clean_env, tmp_path):
    _, _, expected = configs
    cfg, _ = ROWS["deepspeed_plugin_keys"]
    (tmp_path / "nblaunch.yaml").write_text(
        yaml.safe_dump({"num_processes": 2, "mixed_precision": "bf16", "deepspeed_config": cfg["deepspeed_config"]})
    )
    plan = make_plan(resolve_config({}, cwd=tmp_path), gpus=0, cuda_initialized=False)
    got = {k: v for k, v in plan.env_for(0, 29500).items() if k.startswith(PREFIXES)}
    assert got == expected["deepspeed_plugin_keys"] and "ACCELERATE_USE_CPU" not in got


def test_two_plugins_at_once_are_refused_instead_of_one_being_ignored(clean_env):
    with pytest.raises(LaunchConfigError, match="fsdp_config and deepspeed_config are both set"):
        both = {"fsdp_config": {"fsdp_version": 2}, "deepspeed_config": {"zero_stage": 2}}
        make_plan(resolve_config(both, cwd="/"), gpus=2, cuda_initialized=False)
