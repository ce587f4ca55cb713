"""Turn a resolved configuration into a launch plan: how many ranks, which backend, which
devices, fork or spawn, and the environment each rank sees.

Everything here is a pure function of the configuration and of facts about the machine
(GPU count, whether CUDA is initialized in the kernel), so every rule is testable on a
machine without GPUs.

Example::

    >>> p = make_plan(resolve_config({"num_processes": 2}), gpus=0, cuda_initialized=False)
    >>> p.backend, p.start_method, p.device_for(1)
    ('gloo', 'fork', 'cpu')
"""

from __future__ import annotations

import dataclasses
import os

from ..config.launch_rules import DEFAULT_PORT, default_processes_per_machine, processes_per_machine
from ..config.resolve import ResolvedConfig
from ..errors import LaunchConfigError
from .accelerate_env import accelerate_env


@dataclasses.dataclass(frozen=True)
class LaunchPlan:
    num_processes: int  # every rank of the launch, on all machines (WORLD_SIZE)
    backend: str  # "nccl" | "gloo"
    start_method: str  # "fork" | "forkserver" | "spawn"
    start_reason: str  # one line on why this start method (shown to the user when it matters)
    gpu_ids: tuple[int, ...]  # indices, as the kernel sees them, of the GPUs the ranks use; () on CPU
    use_cpu: bool
    master_addr: str
    requested_port: int | None
    output: str
    progress: str
    timeout: float | None
    log_dir: str | None
    base_env: dict  # variables every rank gets (rank-specific ones are added by env_for)
    engine: str = "local"  # the engines.table name: "local" | "elastic" (across machines) | "ray"
    ray: dict | None = None  # engine "ray": address, use_gpu, resources_per_worker, placement_strategy
    notices: tuple[str, ...] = ()  # lines the launch shows before it starts (why spawn, say)
    metrics: str = "on"  # "on": the frameworks' loggers draw the chart too (worker/metric_capture.py)
    # Across machines (torch's elastic launcher)
    processes_per_machine: int = 0  # this machine's share of num_processes (0: all of them)
    num_machines: int = 1
    machine_rank: int = 0
    main_process_ip: str | None = None
    rdzv_port: int | None = None
    rdzv_backend: str = "static"
    backend_reason: str = ""  # one line on why this backend; a notice when it starts with "nblaunch:"

    def device_for(self, local_rank: int) -> str:
        """The device rank ``local_rank`` computes on, as a torch device string."""
        if self.use_cpu or not self.gpu_ids:
            return "cpu"
        # CUDA_VISIBLE_DEVICES lists exactly gpu_ids, so inside a worker they are 0..k-1.
        return f"cuda:{local_rank % len(self.gpu_ids)}"

    def env_for(self, rank: int, port: int) -> dict:
        """The worker environment contract of DESIGN.md, as torchrun / accelerate launch set it."""
        env = dict(self.base_env)
        env.update(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            GROUP_RANK="0",
            ROLE_RANK=str(rank),
            WORLD_SIZE=str(self.num_processes),
            LOCAL_WORLD_SIZE=str(self.num_processes),
            ROLE_WORLD_SIZE=str(self.num_processes),
            MASTER_ADDR=self.master_addr,
            MASTER_PORT=str(port),
        )
        return env


def parse_gpu_ids(spec: str, available: int) -> tuple[int, ...]:
    if spec == "all":
        return tuple(range(available))
    ids = tuple(int(p) for p in spec.split(",") if p != "")
    missing = [i for i in ids if i >= available]
    if missing:
        raise LaunchConfigError(
            "gpu_ids",
            spec,
            None,
            message=f"invalid gpu_ids={spec!r}: GPU {missing[0]} is not present; this kernel sees "
            f"{available} GPU(s)"
            + (f" (indices 0..{available - 1})" if available else "")
            + ". Pick from those, or use gpu_ids='all'. Nothing was started.",
        )
    if len(set(ids)) != len(ids):
        raise LaunchConfigError("gpu_ids", spec, "each GPU index at most once")
    return ids


def choose_backend(requested: str, num_processes: int, gpu_ids: tuple[int, ...], use_cpu: bool) -> str:
    """auto: NCCL when every rank gets its own GPU, gloo otherwise. An explicit backend that
    cannot work is an error before anything starts."""
    own_gpu_each = (not use_cpu) and len(gpu_ids) >= num_processes and num_processes > 0
    if requested == "auto":
        return "nccl" if own_gpu_each else "gloo"
    if requested == "nccl" and not own_gpu_each:
        have = "no GPU" if (use_cpu or not gpu_ids) else f"{len(gpu_ids)} GPU(s)"
        raise LaunchConfigError(
            "backend",
            "nccl",
            None,
            message=f"backend='nccl' needs one GPU per rank, but {num_processes} ranks have {have}"
            f"{' (use_cpu is set)' if use_cpu else ''}. Use backend='gloo' (or 'auto'), or fewer processes. "
            "Nothing was started.",
        )
    return requested


def explain_backend(requested: str, backend: str, num_processes: int, gpu_ids: tuple[int, ...], use_cpu: bool) -> str:
    """Why this backend, in one line; it starts with "nblaunch:" when the user should be told (auto picked
    gloo although the ranks compute on GPUs, because there are more ranks than GPUs)."""
    if requested != "auto":
        return f"backend={requested!r} was asked for"
    if backend == "nccl":
        return "nccl: every rank has a GPU of its own"
    if use_cpu or not gpu_ids:
        return "gloo: the ranks compute on CPU"
    k = len(gpu_ids)
    where = "every rank computes on cuda:0" if k == 1 else f"rank r computes on cuda:(r mod {k})"
    return (
        f"nblaunch: using gloo, not NCCL: {num_processes} ranks share {k} GPU{'s' if k > 1 else ''} and NCCL needs "
        f"a GPU of its own for each rank; {where}. For NCCL, launch at most {k} process{'es' if k > 1 else ''}."
    )


def choose_start_method(requested: str, cuda_initialized: bool, init_site: str | None) -> tuple[str, str]:
    """fork when safe; once CUDA is initialized in the kernel, the forkserver: ranks forked from a clean
    template process that holds torch (``engines.forkserver``), as fast as fork and as safe as spawn."""
    # init_site is a place ("train.py:12", "cell In[3], line 2") or, for the driver below torch, a
    # phrase of its own ("by a library below torch: ...").
    where = "" if not init_site else (f" {init_site}" if init_site.startswith("by ") else f" at {init_site}")
    if requested == "fork":
        if cuda_initialized:
            raise LaunchConfigError(
                "start_method",
                "fork",
                None,
                message=f"start_method='fork' is not possible: CUDA is already initialized in this kernel{where}, and "
                "forked workers would inherit a broken CUDA context. Use start_method='forkserver' (or 'auto'; "
                "'spawn' works too, slower), or restart the kernel and move the CUDA call into the launched "
                "function. Nothing was started.",
            )
        return "fork", "start_method='fork' was asked for"
    if requested in ("spawn", "forkserver"):
        return requested, f"start_method={requested!r} was asked for"
    if cuda_initialized:
        return "forkserver", (
            f"nblaunch: using the forkserver, not fork, because CUDA was initialized in this kernel{where}: the "
            "ranks start from a clean process that already holds torch, so they inherit nothing of this kernel "
            "(names reach them pickled, as under spawn)."
        )
    return "fork", "fork is safe: CUDA is not initialized in this kernel"


def _visible_physical(count: int) -> list[str]:
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is None:
        return [str(i) for i in range(count)]
    return [p.strip() for p in cvd.split(",") if p.strip()][:count]


def make_plan(cfg: ResolvedConfig, *, gpus: int, cuda_initialized: bool, init_site: str | None = None) -> LaunchPlan:
    """Every decision of a launch, before any process starts. Raises LaunchConfigError."""
    v = cfg.values
    if v["engine"] == "ray":
        return ray_plan(v)
    machines = v["num_machines"]
    use_cpu = bool(v["use_cpu"]) or gpus == 0
    gpu_ids = () if use_cpu and v["gpu_ids"] == "all" else parse_gpu_ids(v["gpu_ids"], gpus)
    if v["use_cpu"]:
        gpu_ids = ()
    per_machine = processes_per_machine(v, len(gpu_ids))
    backend = choose_backend(v["backend"], per_machine, gpu_ids, use_cpu)
    method, reason = choose_start_method(v["start_method"], cuda_initialized, init_site)
    if method == "forkserver" and machines > 1:  # torch's elastic launcher runs the ranks: spawn
        method, reason = "spawn", reason.replace("the forkserver, not fork", "spawn, not fork")
    backend_reason = explain_backend(v["backend"], backend, per_machine, gpu_ids, use_cpu)

    env = {str(k): str(x) for k, x in v["env"].items()}
    # the Accelerate config file this launch amounts to: its process count and port, as the plan decides them
    port = v["main_process_port"] or DEFAULT_PORT
    as_launched = {**v, "num_processes": per_machine * machines, "main_process_port": port}
    env.update(accelerate_env(as_launched, use_cpu))
    env.setdefault("PYTHONUNBUFFERED", "1")  # the worker's own subprocesses stream live too
    if "OMP_NUM_THREADS" not in env and "OMP_NUM_THREADS" not in os.environ:  # a user's own value stays
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // per_machine))  # cores shared out, as torchrun
    if gpu_ids:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(_visible_physical(gpus)[i] for i in gpu_ids)
    elif v["use_cpu"] and gpus:
        env["CUDA_VISIBLE_DEVICES"] = ""  # keep CPU runs off the GPUs entirely
    if machines == 1:
        # Keep rendezvous and gloo/NCCL bootstrap on loopback unless the user chose an interface.
        if "GLOO_SOCKET_IFNAME" not in os.environ and "GLOO_SOCKET_IFNAME" not in env:
            env["GLOO_SOCKET_IFNAME"] = "lo"
        if backend == "nccl" and "NCCL_SOCKET_IFNAME" not in os.environ and "NCCL_SOCKET_IFNAME" not in env:
            env["NCCL_SOCKET_IFNAME"] = "lo"
        # The kernel hosts the TCPStore (as torchrun's agent does); every rank is a client.
        env["TORCHELASTIC_USE_AGENT_STORE"] = "True"

    return LaunchPlan(
        num_processes=per_machine * machines,
        backend=backend,
        start_method=method,
        start_reason=reason,
        gpu_ids=gpu_ids,
        use_cpu=use_cpu,
        master_addr="127.0.0.1",
        requested_port=v["main_process_port"],
        output=v["output"],
        progress=v["progress"],
        timeout=v["timeout"],
        log_dir=v["log_dir"],
        base_env=env,
        engine="elastic" if machines > 1 else "local",
        notices=tuple(line for line in (reason, backend_reason) if line.startswith("nblaunch:")),
        processes_per_machine=per_machine,
        metrics=v["metrics"],
        num_machines=machines,
        machine_rank=v["machine_rank"],
        main_process_ip=v["main_process_ip"],
        rdzv_port=v["main_process_port"] or DEFAULT_PORT,
        rdzv_backend=v["rdzv_backend"],
        backend_reason=backend_reason,
    )


def ray_plan(v: dict) -> LaunchPlan:
    """engine: ray: Ray places the workers (and their GPUs); the code travels to them by cloudpickle."""
    if v["num_machines"] > 1:
        raise LaunchConfigError(
            "num_machines",
            v["num_machines"],
            None,
            message=f"num_machines={v['num_machines']} with engine='ray': Ray places the workers on the cluster's "
            "machines by itself. Leave num_machines at 1, or use engine='local' for torch's elastic launcher. "
            "Nothing was started.",
        )
    use_gpu = bool(v["use_gpu"])
    backend = v["backend"] if v["backend"] != "auto" else ("nccl" if use_gpu else "gloo")
    if backend == "nccl" and not use_gpu:
        raise LaunchConfigError(
            "backend",
            "nccl",
            None,
            message="backend='nccl' with engine='ray' needs use_gpu: true, so that Ray gives each worker a GPU. "
            "Nothing was started.",
        )
    per_worker = dict(v["resources_per_worker"])
    env = {str(k): str(x) for k, x in v["env"].items()}
    n = v["num_processes"] or default_processes_per_machine(0)
    env.update(accelerate_env({**v, "num_processes": n}, not use_gpu))
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("OMP_NUM_THREADS", str(max(1, int(per_worker.get("CPU", 1)))))
    if v["ray_address"] == "local" and "GLOO_SOCKET_IFNAME" not in os.environ and "GLOO_SOCKET_IFNAME" not in env:
        env["GLOO_SOCKET_IFNAME"] = "lo"  # a Ray of this kernel's own: everything stays on 127.0.0.1
    return LaunchPlan(
        num_processes=n,
        backend=backend,
        start_method="spawn",
        start_reason="engine='ray': the code is sent to Ray's workers with cloudpickle",
        gpu_ids=(),
        use_cpu=not use_gpu,
        master_addr="",
        requested_port=None,
        output=v["output"],
        progress=v["progress"],
        timeout=v["timeout"],
        log_dir=v["log_dir"],
        base_env=env,
        engine="ray",
        processes_per_machine=n,
        metrics=v["metrics"],
        ray={
            "address": v["ray_address"],
            "use_gpu": use_gpu,
            "resources_per_worker": per_worker,
            "placement_strategy": v["placement_strategy"].upper(),
        },
    )
