"""The launch plan's rules (backend, devices, start method, environment), including GPU machines.

These are pure functions of the configuration and of facts about the machine, so the NCCL
path is checked here on a machine without GPUs by stating the GPU count.
"""

from __future__ import annotations

import os
import types

import pytest

from kernelside.config import resolve_config
from kernelside.errors import LaunchConfigError
from kernelside.launch import cuda_guard
from kernelside.launch.plan import make_plan


def plan(gpus=0, cuda_initialized=False, site=None, **arguments):
    return make_plan(
        resolve_config(arguments, config=None, cwd="/"), gpus=gpus, cuda_initialized=cuda_initialized, init_site=site
    )


@pytest.fixture(autouse=True)
def no_config_files(monkeypatch, tmp_path):
    monkeypatch.delenv("NBLAUNCH_CONFIG", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # no Accelerate default config either
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_cpu_machine_uses_gloo_two_workers_and_cpu_devices():
    p = plan()
    assert (p.num_processes, p.backend, p.start_method) == (2, "gloo", "fork")
    assert [p.device_for(r) for r in range(2)] == ["cpu", "cpu"]
    env = p.env_for(1, 29555)
    assert env["ACCELERATE_USE_CPU"] == "True"  # as accelerate launch exports it for a MULTI_CPU config
    assert "CUDA_VISIBLE_DEVICES" not in env


def test_gpu_machine_gives_each_rank_its_own_gpu_with_nccl():
    p = plan(gpus=4)
    assert p.num_processes == 4 and p.backend == "nccl"
    assert [p.device_for(r) for r in range(4)] == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    env = p.env_for(2, 29555)
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    assert env["RANK"] == env["LOCAL_RANK"] == "2"
    assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == "4"
    assert env["NCCL_SOCKET_IFNAME"] == "lo" and env["GLOO_SOCKET_IFNAME"] == "lo"
    assert "ACCELERATE_USE_CPU" not in env


def test_gpu_ids_select_and_renumber_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    p = plan(gpus=4, gpu_ids="1,3")
    assert p.num_processes == 2 and p.backend == "nccl"
    assert p.env_for(0, 1)["CUDA_VISIBLE_DEVICES"] == "5,7"  # physical ids behind the kernel's view
    assert [p.device_for(r) for r in range(2)] == ["cuda:0", "cuda:1"]


def test_more_ranks_than_gpus_falls_back_to_gloo_and_shares_gpus():
    p = plan(gpus=2, num_processes=4)
    assert p.backend == "gloo"
    assert [p.device_for(r) for r in range(4)] == ["cuda:0", "cuda:1", "cuda:0", "cuda:1"]


def test_explicit_nccl_without_a_gpu_per_rank_is_refused():
    with pytest.raises(LaunchConfigError, match="needs one GPU per rank, but 4 ranks have 2 GPU"):
        plan(gpus=2, num_processes=4, backend="nccl")


def test_use_cpu_hides_gpus_from_workers():
    p = plan(gpus=2, use_cpu=True)
    assert p.backend == "gloo" and p.num_processes == 2
    assert p.env_for(0, 1)["CUDA_VISIBLE_DEVICES"] == ""
    assert p.device_for(0) == "cpu"


def test_missing_gpu_id_names_what_exists():
    with pytest.raises(LaunchConfigError, match=r"GPU 5 is not present; this kernel sees 2 GPU\(s\) \(indices 0..1\)"):
        plan(gpus=2, gpu_ids="0,5")


def test_cuda_initialized_in_kernel_switches_to_the_forkserver_and_says_where():
    p = plan(gpus=2, cuda_initialized=True, site="cell In[4], line 2: x = torch.ones(1).cuda()")
    assert p.start_method == "forkserver"
    assert "using the forkserver, not fork, because CUDA was initialized in this kernel at cell In[4], line 2" in (
        p.start_reason
    )
    assert p.notices[0] == p.start_reason  # the one-line notice of the launch


def test_forkserver_and_spawn_asked_for_are_kept_and_forkserver_across_machines_becomes_spawn():
    assert plan(start_method="forkserver").start_method == "forkserver"
    assert plan(gpus=1, cuda_initialized=True, start_method="spawn").start_method == "spawn"
    across = plan(start_method="forkserver", num_machines=2, num_processes=4, main_process_ip="10.0.0.1")
    assert across.start_method == "spawn"  # torch's elastic launcher starts those ranks


def test_fork_with_cuda_initialized_is_a_clear_error_naming_the_site():
    with pytest.raises(LaunchConfigError, match="start_method='fork' is not possible.*at train.py:12"):
        plan(gpus=1, cuda_initialized=True, site="train.py:12", start_method="fork")


def test_accelerate_variables_follow_the_config():
    p = plan(
        gpus=2,  # Accelerate runs FSDP on GPUs only; without them the launch is refused (test_accelerate_env.py)
        mixed_precision="fp16",
        dynamo_config={"dynamo_backend": "INDUCTOR"},
        fsdp_config={"fsdp_sharding_strategy": "FULL_SHARD", "fsdp_offload_params": False},
    )
    env = p.env_for(0, 1)
    assert env["ACCELERATE_MIXED_PRECISION"] == "fp16"
    assert env["ACCELERATE_DYNAMO_BACKEND"] == "INDUCTOR"
    assert env["ACCELERATE_USE_FSDP"] == "true"
    assert env["FSDP_SHARDING_STRATEGY"] == "FULL_SHARD" and env["FSDP_OFFLOAD_PARAMS"] == "false"


def test_several_machines_need_the_address_of_machine_0_a_valid_rank_and_an_even_split():
    with pytest.raises(LaunchConfigError, match="num_machines=2 needs main_process_ip"):
        plan(num_machines=2)
    with pytest.raises(LaunchConfigError, match="invalid machine_rank=2"):
        plan(num_machines=2, machine_rank=2, main_process_ip="10.0.0.1")
    with pytest.raises(LaunchConfigError, match="num_processes=3 counts the processes of all num_machines=2"):
        plan(num_machines=2, num_processes=3, main_process_ip="10.0.0.1")


def test_several_machines_split_num_processes_and_leave_the_network_interface_alone():
    p = plan(num_machines=2, machine_rank=1, num_processes=4, main_process_ip="10.0.0.1", rdzv_backend="c10d")
    assert (p.processes_per_machine, p.num_machines, p.machine_rank) == (2, 2, 1)
    assert p.num_processes == 4  # every machine's ranks: num_processes means the same on every path
    assert (p.main_process_ip, p.rdzv_port, p.rdzv_backend) == ("10.0.0.1", 29500, "c10d")
    assert "GLOO_SOCKET_IFNAME" not in p.base_env and "TORCHELASTIC_USE_AGENT_STORE" not in p.base_env


def test_cuda_guard_records_the_first_site_that_initializes_cuda():
    state = {"init": False}
    fake_cuda = types.SimpleNamespace(is_initialized=lambda: state["init"])

    def lazy_init():
        state["init"] = True

    fake_cuda._lazy_init = lazy_init
    saved = cuda_guard.FIRST_INIT.site, cuda_guard.FIRST_INIT.installed_on
    cuda_guard.FIRST_INIT.site = None
    try:
        cuda_guard.install(fake_cuda)
        fake_cuda._lazy_init()  # this line is the site
        site = cuda_guard.first_init_site()
        fake_cuda._lazy_init()  # later calls do not move it
        assert cuda_guard.first_init_site() == site
    finally:
        cuda_guard.FIRST_INIT.site, cuda_guard.FIRST_INIT.installed_on = saved
    assert site.startswith(f"{__file__}:") and "fake_cuda._lazy_init()  # this line is the site" in site


def test_cuda_guard_is_installed_on_torch_by_importing_kernelside():
    import torch

    import kernelside  # noqa: F401

    assert getattr(torch.cuda._lazy_init, "_nblaunch_wrapped", False)


def test_threads_per_worker_share_the_cores_unless_the_user_set_them(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert plan(num_processes=2).env_for(0, 1)["OMP_NUM_THREADS"] == str(max(1, (os.cpu_count() or 1) // 2))
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert "OMP_NUM_THREADS" not in plan(num_processes=2).env_for(0, 1)  # the kernel's own value is inherited
    assert plan(num_processes=2, env={"OMP_NUM_THREADS": "5"}).env_for(0, 1)["OMP_NUM_THREADS"] == "5"


def test_more_ranks_than_gpus_says_once_why_gloo_and_not_nccl():
    p = plan(gpus=1, num_processes=4)
    assert p.backend == "gloo"
    assert p.backend_reason.startswith("nblaunch: using gloo, not NCCL: 4 ranks share 1 GPU")
    assert "every rank computes on cuda:0" in p.backend_reason and "at most 1 process." in p.backend_reason
    assert "\n" not in p.backend_reason
    # nothing to say when the choice is the expected one, or was the user's own
    quiet = (plan(gpus=4), plan(gpus=0), plan(gpus=1, num_processes=4, backend="gloo"), plan(gpus=2, use_cpu=True))
    for q in quiet:
        assert not q.backend_reason.startswith("nblaunch:"), q.backend_reason


def test_cuda_driver_initialized_below_torch_is_named_as_such_in_forkserver_and_fork_messages():
    site = f"{cuda_guard.BELOW_TORCH}: the CUDA driver (/usr/lib/libcuda.so.1) was initialized outside torch.cuda"
    p = plan(gpus=1, cuda_initialized=True, site=site)
    assert p.start_method == "forkserver"
    assert "CUDA was initialized in this kernel by a library below torch: the CUDA driver" in p.start_reason
    with pytest.raises(LaunchConfigError, match="already initialized in this kernel by a library below torch"):
        plan(gpus=1, cuda_initialized=True, site=site, start_method="fork")
