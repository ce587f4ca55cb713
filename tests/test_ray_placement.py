"""Where a Ray world puts its ranks, checked on what nblaunch builds, without a cluster or a GPU: the placement
strategy from nblaunch.yaml or the flag, each actor's options (its bundle, no restarts by Ray, Ray's
CUDA_VISIBLE_DEVICES masking off with GPUs) and each rank's CUDA device and environment.

(The placement itself, on a real multi-node cluster, is tests/test_ray_live.py.)
"""

from __future__ import annotations

import io
import os

import pytest

from kernelside.config import resolve_config
from kernelside.errors import LaunchConfigError
from kernelside.launch.runner import plan_for
from kernelside.live.ray_placement import NOSET_CUDA_VISIBLE_DEVICES, actor_options, bundle_of, strategy_of
from kernelside.live.ray_world import RayWorld
from kernelside.worker.ray_live_rank import cuda_index


def _plan(**values):
    return plan_for(resolve_config({"engine": "ray", **values}, config=os.devnull))


@pytest.mark.parametrize("value", ["pack", "spread", "strict_pack", "strict_spread"])
def test_placement_strategy_from_the_config_reaches_the_ray_plan_as_rays_name(value):
    assert strategy_of(_plan(placement_strategy=value).ray) == value.upper()


def test_pack_is_the_default_placement_and_a_bad_one_is_refused_naming_the_choices(tmp_path):
    assert strategy_of(_plan().ray) == "PACK"
    path = tmp_path / "nblaunch.yaml"
    path.write_text("engine: ray\nplacement_strategy: whole\n")
    with pytest.raises(LaunchConfigError) as info:
        resolve_config({}, config=path)
    assert "placement_strategy='whole'" in str(info.value)
    assert "'pack', 'spread', 'strict_pack', 'strict_spread'" in str(info.value)


def test_a_gpu_rank_actor_has_its_bundle_one_gpu_no_ray_restarts_and_rays_gpu_masking_off():
    bundle = bundle_of({"resources_per_worker": {"CPU": 4, "accel": 1}, "use_gpu": True})
    assert bundle == {"CPU": 4.0, "GPU": 1.0, "accel": 1.0}
    pg = object()  # (the options only name it)
    opts = actor_options(pg, 3, bundle)
    assert (opts["num_cpus"], opts["num_gpus"], opts["resources"]) == (4.0, 1.0, {"accel": 1.0})
    assert opts["max_restarts"] == 0 and opts["max_task_retries"] == 0  # nblaunch replaces a lost rank itself
    where = opts["scheduling_strategy"]
    assert where.placement_group is pg and where.placement_group_bundle_index == 3
    assert opts["runtime_env"] == {"env_vars": {NOSET_CUDA_VISIBLE_DEVICES: "1"}}
    assert NOSET_CUDA_VISIBLE_DEVICES == "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"


def test_a_cpu_rank_actor_leaves_rays_environment_alone():
    opts = actor_options(object(), 0, bundle_of({"resources_per_worker": {}, "use_gpu": False}))
    assert "runtime_env" not in opts and opts["num_gpus"] == 0 and opts["resources"] is None


def test_the_ray_switch_nblaunch_sets_is_the_one_ray_reads():
    nvidia = pytest.importorskip("ray._private.accelerators.nvidia_gpu")
    assert nvidia.NOSET_CUDA_VISIBLE_DEVICES_ENV_VAR == NOSET_CUDA_VISIBLE_DEVICES


@pytest.mark.parametrize(
    ("gpus", "visible", "index"),
    [
        ([1], None, 1),  # every GPU of the node visible: Ray's id is the index
        ([5], "4,5,6,7", 1),  # the node's own CUDA_VISIBLE_DEVICES: the position in it
        ([2], "2", 0),  # Ray masked it anyway (an older Ray): its only GPU
        ([], None, None),
    ],
)
def test_a_ranks_cuda_device_is_its_own_gpu_among_those_its_process_sees(gpus, visible, index):
    assert cuda_index(gpus, visible) == index


def test_each_gpu_rank_is_set_to_its_own_device_with_torchruns_environment():
    world = RayWorld(_plan(use_gpu=True, num_processes=4), "/nonexistent", io.StringIO(), io.StringIO(), render="text")
    world.host, world.port = "10.0.0.5", 29511
    spec = world._spec(3, 1, 1, 2, {"gpus": [1], "cuda": 1}, 0)
    assert spec.backend == "nccl" and spec.device == "cuda:1"  # torch.cuda.set_device(local rank 1) in the rank
    env = spec.env
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == ("3", "1", "4", "2")
    assert (env["NODE_RANK"], env["MASTER_ADDR"], env["MASTER_PORT"]) == ("1", "10.0.0.5", "29511")
    assert "CUDA_VISIBLE_DEVICES" not in env  # not masked by nblaunch either: NCCL sees the node's GPUs
    cpu = RayWorld(_plan(num_processes=2), "/nonexistent", io.StringIO(), io.StringIO(), render="text")
    cpu.host, cpu.port = "127.0.0.1", 29512
    assert cpu._spec(0, 0, 0, 2, {"gpus": [], "cuda": None}, 0).device == "cpu"


def test_a_replacement_rank_joins_the_rebuilt_group_its_spec_names():
    world = RayWorld(_plan(num_processes=2), "/nonexistent", io.StringIO(), io.StringIO(), render="text")
    world.host, world.port = "127.0.0.1", 29513
    assert world._spec(1, 1, 0, 2, {"gpus": [], "cuda": None}, 7).group_gen == 7
