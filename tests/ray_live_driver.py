"""A real kernel with live ranks on a real multi-node Ray cluster (``%distributed_start -n 4 --engine ray``).

Run by test_ray_live.py inside a loopback-only network namespace. This driver starts a
``ray.cluster_utils.Cluster`` (a head without CPUs, two worker nodes of 2 CPUs each: 4 ranks over 2 nodes),
a kernel whose ``nblaunch.yaml`` points at it, runs the cells, then notebooks/ray_live.ipynb (as
notebooks/execute.py runs it, with ``NBLAUNCH_CONFIG`` naming the same file; the executed copy goes to the folder
given as the first argument), then ends kernels with a session up in each way a kernel ends: a restart, a graceful
shutdown, a SIGKILL. After each end and each ``%distributed_stop`` it looks at what is left through Ray's own state
(the GCS: actors, placement groups) and /proc; then it stops the cluster and prints one JSON object.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import sys
import tempfile
import time

import ray
from kernel import REPO, Kernel
from ray.cluster_utils import Cluster
from ray.util import placement_group_table
from ray_dashboard_steps import dashboard_steps

STATUS = """
from kernelside.live import registry
_s = registry.current()
print(json.dumps([{k: r[k] for k in ("rank", "pid", "node", "local_rank")} for r in _s.status()]))
"""

# the session's entry in the Runs view (its state.json, as the server reads it)
RUN_ENTRY = """
import os
_st = json.load(open(os.path.join(registry.current().log_dir, "state.json")))
print(json.dumps([{k: r.get(k) for k in ("rank", "pid", "pid_start", "node")} for r in _st["ranks"]]))
"""

MODEL_CELL = """%%distributed
import torch, os
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
torch.manual_seed(rank)  # different on each rank: DDP makes them equal
model = DDP(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(16, 4), torch.randn(16, 1)
for step in range(12):
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
    print(f"step {step} rank {rank} node {os.environ['NODE_RANK']} local {os.environ['LOCAL_RANK']}", flush=True)
"""

# every rank's parameters, gathered: equal across nodes after DDP's steps
CHECKSUM_CELL = """%%distributed --return same,checksum
w = torch.cat([p.detach().flatten() for p in model.parameters()])
got = [torch.zeros_like(w) for _ in range(world_size)]
dist.all_gather(got, w)
same = all(torch.equal(got[0], g) for g in got)
checksum = float(w.sum())
"""

PUSH = "scale = 7\n%distributed_push scale"
PUSHED_CELL = """%%distributed --return total
t = torch.tensor([float(scale)])
dist.all_reduce(t)
total = t.item()
"""

ERROR_CELL = """%%distributed
t = torch.ones(1)
if rank == 1:
    raise ValueError("bad shard on rank 1")
dist.all_reduce(t)
"""

BARRIER_CELL = """%%distributed
import time
if rank == 3:
    print("rank 3 sleeping", flush=True)
    while True:
        time.sleep(0.05)
if rank == 0:
    print("rank 0 in barrier", flush=True)
dist.barrier()
"""

PROGRESS_CELL = """%%distributed
import time
from kernelside import log_metrics, progress
for i in progress(range(20), desc="train"):
    log_metrics(step=i, loss=1 / (i + 1))
    time.sleep(0.02)
"""

INPUT_CELL = """%%distributed
if rank == 0:
    got = input("name? ")
    print("rank 0 got", got, flush=True)
"""

FAIL_CELL = """%%distributed
if rank == 1:
    zz = 5
    raise ValueError("boom on rank 1")
"""


def widgets_of(cell) -> dict:
    """What a cell's widgets showed: its progress bars, whether a metrics chart came, every HTML text."""
    models, texts = [], []
    for kind, content in cell.messages:
        data = content.get("data", {}) if kind in ("comm_open", "comm_msg") else {}
        state = data.get("state", {})
        if kind == "comm_open":
            models.append(state.get("_model_name", ""))
        if isinstance(state.get("value"), str):
            texts.append(state["value"])
    return {
        "bars": sum(m in ("FloatProgressModel", "IntProgressModel") for m in models),
        "chart": any(t.startswith('<div class="nblaunch-chart"') for t in texts),
        "tabs": "TabModel" in models,
        "text": "\n".join(texts),
    }


ORDER_CELL = """%%distributed
for i in range(200):
    print(f"line {i}", flush=(i % 7 == 0))
"""


def shown(cell) -> dict:
    return {
        "stdout": cell.stdout,
        "stderr": cell.stderr,
        "result": (cell.result or {}).get("text/plain"),
        "error": [cell.error["ename"], cell.error["evalue"]] if cell.error else None,
    }


def timed(k, code, **kw) -> dict:
    t = time.monotonic()
    out = shown(k.run(code, timeout=300, **kw))
    out["s"] = time.monotonic() - t
    return out


def left_in_ray(pids: list[int]) -> dict:
    """What Ray and /proc still hold of the live ranks: alive actors of the class, placement groups not removed."""
    actors = [
        a
        for a in ray._private.state.actors().values()
        if a.get("ActorClassName", "").endswith("LiveRankActor") and a.get("State") != "DEAD"
    ]
    groups = [g for g in placement_group_table().values() if g.get("state") != "REMOVED"]
    procs = [p for p in pids if os.path.exists(f"/proc/{p}")]
    return {"actors": len(actors), "placement_groups": len(groups), "processes": procs}


def wait_nothing_left(pids: list[int], timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        left = left_in_ray(pids)
        if (not left["actors"] and not left["placement_groups"] and not left["processes"]) or (
            time.monotonic() > deadline
        ):
            return left
        time.sleep(0.2)


def pids_of(k) -> list[int]:
    return [r["pid"] for r in json.loads(k.run(STATUS).ok().stdout)]


def run_notebook(config: str, out_dir: str) -> dict:
    """notebooks/ray_live.ipynb, executed as notebooks/execute.py executes it, in a kernel that reads ``config``
    (``NBLAUNCH_CONFIG``, as a user's nblaunch.yaml would say where the cluster is): where the executed copy is,
    the first failing cell's error if any, and what its ranks left once it ended (pids from %distributed_status)."""
    spec = importlib.util.spec_from_file_location("execute_nb", os.path.join(REPO, "notebooks", "execute.py"))
    execute_nb = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(execute_nb)
    path = os.path.join(REPO, "notebooks", "ray_live.ipynb")
    out: dict = {"path": os.path.join(out_dir, "ray_live.executed.ipynb"), "error": None}
    os.environ["NBLAUNCH_CONFIG"] = config
    t0 = time.monotonic()
    try:
        _, nb = execute_nb.execute(path, out_dir, timeout=300)
    except Exception as e:  # noqa: BLE001 - the failing cell, said in the test; the executed copy is written anyway
        out["error"] = f"{type(e).__name__}: {e}"[-4000:]
        return out
    finally:
        del os.environ["NBLAUNCH_CONFIG"]
        out["s"] = time.monotonic() - t0
    status = next(c for c in nb.cells if c.cell_type == "code" and c.source == "%distributed_status")
    text = "".join(o.get("text", "") for o in status.outputs)
    out["pids"] = [int(p) for p in re.findall(r"rank \d+: pid (\d+)", text)]
    out["left"] = wait_nothing_left(out["pids"], timeout=30)
    return out


def gpu_masking(cluster) -> dict:
    """Two rank actors placed as nblaunch places them with ``use_gpu``, on a node that declares 2 GPUs (Ray counts
    GPUs as it counts any resource: none is real here), against a plain Ray task given one GPU: what each one sees
    of CUDA_VISIBLE_DEVICES, which GPU Ray gave it and the CUDA index the rank would set."""
    from kernelside.live.ray_placement import bundle_of, place, start_actor

    node = cluster.add_node(num_cpus=0, num_gpus=2)
    bundle = bundle_of({"resources_per_worker": {"CPU": 0}, "use_gpu": True})
    pg = place(ray, 2, bundle, cluster.address)
    actors = [start_actor(ray, pg, i, bundle) for i in range(2)]
    try:
        where = ray.get([a.where.remote() for a in actors], timeout=120)
        seen = ray.get([a.__ray_call__.remote(lambda _: os.environ.get("CUDA_VISIBLE_DEVICES")) for a in actors])
    finally:
        for a in actors:
            ray.kill(a, no_restart=True)
        ray.util.remove_placement_group(pg)

    @ray.remote(num_cpus=0, num_gpus=1)
    def masked():
        return os.environ.get("CUDA_VISIBLE_DEVICES"), [str(g) for g in ray.get_gpu_ids()]

    plain = ray.get(masked.remote(), timeout=120)
    cluster.remove_node(node)
    return {
        "ranks": [{"gpus": w["gpus"], "cuda": w["cuda"], "visible": v} for w, v in zip(where, seen, strict=True)],
        "plain_task": list(plain),
    }


def main() -> None:
    out_dir = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="nblaunch-ray-live-notebook-")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    for _ in range(2):
        cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)  # this driver reads Ray's state (the GCS)
    folder = tempfile.mkdtemp(prefix="nblaunch-ray-live-")
    with open(os.path.join(folder, "nblaunch.yaml"), "w") as fh:
        fh.write(f"engine: ray\nray_address: '{cluster.address}'\n")
    out: dict = {"nodes": len([n for n in ray.nodes() if n["Alive"]])}
    pids: list[int] = []
    k = Kernel(cwd=folder)
    try:
        k.run("%load_ext kernelside\nimport json").ok()
        out["unfit"] = timed(k, "%distributed_start -n 5 --engine ray")  # 4 CPUs in the cluster
        out["unfit_left"] = left_in_ray([])
        out["start"] = timed(k, "%distributed_start -n 4 --engine ray")
        out["ranks"] = json.loads(k.run(STATUS).ok().stdout)
        out["status"] = shown(k.run("%distributed_status"))
        out["run_entry"] = json.loads(k.run(RUN_ENTRY).ok().stdout)
        pids = [r["pid"] for r in out["ranks"]]
        out["model"] = timed(k, MODEL_CELL)
        out["checksum"] = timed(k, CHECKSUM_CELL + "\n")
        out["check1"] = shown(k.run("print(same, checksum)"))
        out["push"] = timed(k, PUSH)
        out["pushed"] = shown(k.run(PUSHED_CELL + "\n"))
        out["pushed_value"] = shown(k.run("print(total)"))
        out["error"] = timed(k, ERROR_CELL)
        out["after_error"] = timed(k, CHECKSUM_CELL)
        out["check2"] = shown(k.run("print(same, checksum)"))
        out["pids_after_error"] = [r["pid"] for r in json.loads(k.run(STATUS).ok().stdout)]

        pressed = []

        def interrupt_once(kind, content):
            if "rank 0 in barrier" in content.get("text", "") and not pressed:
                pressed.append(time.monotonic())
                k.interrupt()

        out["interrupt"] = shown(k.run(BARRIER_CELL, timeout=120, on_output=interrupt_once))
        out["interrupt"]["stop_s"] = time.monotonic() - pressed[0] if pressed else None
        out["after_interrupt"] = timed(k, CHECKSUM_CELL)
        out["check3"] = shown(k.run("print(same, checksum)"))
        out["pids_after_interrupt"] = [r["pid"] for r in json.loads(k.run(STATUS).ok().stdout)]
        out["order"] = timed(k, ORDER_CELL)
        out["widgets"] = widgets_of(k.run(PROGRESS_CELL, timeout=120).ok())
        out["output_all"] = widgets_of(k.run("%%distributed --output all\nprint(f'hello from {rank}')").ok())
        out["return_all"] = shown(k.run("%%distributed --return-from all --return v\nv = rank * 7\n"))
        out["v"] = shown(k.run("print(v)"))
        asked: list = []
        out["input"] = shown(k.run(INPUT_CELL, timeout=120, on_input=lambda p, _: asked.append(p) or "forty-two"))
        out["asked"] = asked
        out["fail"] = shown(k.run(FAIL_CELL, timeout=120))
        prompts: list = []

        def pdb_answers(prompt, _password):
            prompts.append(prompt)
            return "p zz" if len(prompts) == 1 else "q"

        out["debug"] = shown(k.run("%debug", timeout=120, on_input=pdb_answers))
        out["debug_prompts"] = prompts
        out["x1"] = [timed(k, "%%distributed\nx = 1\n")["s"] for _ in range(5)]
        out["stop"] = timed(k, "%distributed_stop")
        out["stop_left"] = wait_nothing_left(pids, timeout=10)
        # the notebook, on this cluster's 4 CPUs once the session above gave them back
        out["notebook"] = run_notebook(os.path.join(folder, "nblaunch.yaml"), out_dir)
        out["gpu_masking"] = gpu_masking(cluster)

        # each way a kernel ends, with a session up: nblaunch's and Ray's clean-up must leave nothing. This session
        # counts only the kernel's own Ray node (the head, without CPUs) as its machine: both its ranks, on worker
        # nodes, are "on other machines" and report their own resources; its dashboard is looked at and stopped
        k.run("import os\nos.environ['NBLAUNCH_RAY_SAME_MACHINE'] = 'node'").ok()
        out["restart"] = timed(k, "%distributed_start -n 2 --engine ray")
        out["second_pids"] = pids = pids_of(k)
        out["dashboard"] = dashboard_steps(k)
        # then a restart as JupyterLab's (a shutdown request, then the same kernel's new process)
        process = k.km.provisioner.process
        k.km.restart_kernel(now=False)
        out["restart_exit"] = process.poll()  # 0: the old kernel ended by itself, not killed after the 5 s
        k.kc.wait_for_ready(timeout=60)
        out["kernel_restart_left"] = wait_nothing_left(pids, timeout=30)
        # the restarted kernel starts a session again, then ends gracefully (a shutdown request, the kill after 5 s)
        k.run("%load_ext kernelside\nimport json").ok()
        out["after_restart"] = timed(k, "%distributed_start -n 2 --engine ray")
        out["third_pids"] = pids = pids_of(k)
        process = k.km.provisioner.process
        k.km.shutdown_kernel(now=False)
        out["end_exit"] = process.poll()
        out["kernel_end_left"] = wait_nothing_left(pids, timeout=30)
        # a kernel of its own dies by SIGKILL (to its process alone, as the OOM killer would)
        k2 = Kernel(cwd=folder)
        try:
            k2.run("%load_ext kernelside\nimport json").ok()
            out["before_kill"] = timed(k2, "%distributed_start -n 2 --engine ray")
            out["fourth_pids"] = pids = pids_of(k2)
            os.kill(k2.pid, signal.SIGKILL)
            out["kernel_kill_left"] = wait_nothing_left(pids, timeout=30)
        finally:
            k2.shutdown()
    except Exception as e:  # what ran so far, with the failure: the test says which step broke
        out["crash"] = f"{type(e).__name__}: {e}"
    finally:
        if k.km.is_alive():
            k.shutdown()
        else:
            k.kc.stop_channels()
    out["last_left"] = wait_nothing_left(pids, timeout=30)  # (after a crash: whatever the last step had up)
    ray.shutdown()
    cluster.shutdown()
    print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
