"""notebook_launcher() on real worker processes with real torch.distributed (gloo on CPU)."""

from __future__ import annotations

import io
import os
import socket
import sys
import time

import pytest
import torch

from kernelside import LaunchConfigError, LaunchTimeoutError, WorkerError, last_report, notebook_launcher

pytestmark = pytest.mark.usefixtures("no_leaks")


def train_ddp(lr, steps=5):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(steps):
        x = torch.randn(8, 4, generator=g)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"rank {dist.get_rank()} of {dist.get_world_size()} done")
    return {"final_loss": loss.item(), "weights": model.module.state_dict(), "rank": dist.get_rank()}


def test_ddp_training_returns_rank0_value_and_weights_agree_across_ranks(capfd):
    result = notebook_launcher(train_ddp, args=(0.1,), num_processes=2)
    assert result["rank"] == 0
    assert set(result["weights"]) == {"weight", "bias"}
    assert result["weights"]["weight"].device.type == "cpu"
    out = capfd.readouterr().out
    assert "rank 0 of 2 done" in out
    assert "rank 1 of 2 done" not in out  # other ranks go to their log files


def test_return_all_lists_every_rank_value_and_ddp_keeps_weights_in_sync():
    results = notebook_launcher(train_ddp, args=(0.1,), num_processes=2, return_all=True)
    assert [r["rank"] for r in results] == [0, 1]
    assert torch.equal(results[0]["weights"]["weight"], results[1]["weights"]["weight"])


def report_env():
    keys = [
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "ACCELERATE_MIXED_PRECISION",
        "ACCELERATE_USE_CPU",
        "GLOO_SOCKET_IFNAME",
    ]
    import torch.distributed as dist

    return {
        "env": {k: os.environ.get(k) for k in keys},
        "initialized": dist.is_initialized(),
        "executable": sys.executable,
        "pgid_is_own": os.getpgid(0) == os.getpid(),
    }


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_workers_see_the_torchrun_environment_contract(method):
    results = notebook_launcher(
        report_env, num_processes=2, mixed_precision="bf16", start_method=method, return_all=True
    )
    for rank, r in enumerate(results):
        env = r["env"]
        assert env["RANK"] == env["LOCAL_RANK"] == str(rank)
        assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == "2"
        assert env["MASTER_ADDR"] == "127.0.0.1"
        assert env["MASTER_PORT"] == str(last_report().port)
        assert env["ACCELERATE_MIXED_PRECISION"] == "bf16"
        assert env["ACCELERATE_USE_CPU"] == "True"  # as accelerate launch exports it for a MULTI_CPU config
        assert env["GLOO_SOCKET_IFNAME"] == "lo"
        assert r["initialized"] is True
        assert r["executable"] == sys.executable
        assert r["pgid_is_own"] is True
    assert last_report().start_method == method


def accelerate_state():
    from accelerate import Accelerator

    acc = Accelerator()
    return {
        "type": str(acc.distributed_type),
        "n": acc.num_processes,
        "index": acc.process_index,
        "mp": str(acc.mixed_precision),
    }


def test_accelerator_inside_worker_sees_multi_cpu_and_requested_precision():
    results = notebook_launcher(accelerate_state, num_processes=2, mixed_precision="bf16", return_all=True)
    assert [r["index"] for r in results] == [0, 1]
    for r in results:
        assert r["type"].endswith("MULTI_CPU")
        assert r["n"] == 2
        assert r["mp"] == "bf16"


def script_style_ddp():
    """Existing DDP scripts call init_process_group themselves, often by a bare imported name."""
    import torch
    import torch.distributed as dist
    from torch.distributed import init_process_group

    init_process_group("gloo")
    dist.init_process_group(backend="gloo", init_method="env://")
    t = torch.tensor([dist.get_rank() + 1.0])
    dist.all_reduce(t)
    dist.destroy_process_group()
    return t.item()


def test_function_that_initializes_its_own_process_group_still_works():
    assert notebook_launcher(script_style_ddp, num_processes=2) == 3.0


def test_num_processes_none_means_two_workers_without_gpus():
    notebook_launcher(report_env)
    assert last_report().world_size == 2


def whoami():
    import torch.distributed as dist

    return dist.get_rank(), dist.get_world_size()


def test_use_port_is_honoured_when_free(free_port):
    notebook_launcher(whoami, num_processes=2, use_port=str(free_port))
    assert last_report().port == free_port


def test_taken_port_falls_back_to_a_free_one_with_one_line(capfd):
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen(1)
    taken = blocker.getsockname()[1]
    try:
        assert notebook_launcher(whoami, num_processes=2, use_port=taken) == (0, 2)
    finally:
        blocker.close()
    out = capfd.readouterr().out
    assert f"port {taken} is in use; using free port {last_report().port} instead" in out
    assert last_report().port != taken


def test_launches_in_a_row_never_collide():
    ports = []
    for _ in range(3):
        assert notebook_launcher(whoami, num_processes=2) == (0, 2)
        ports.append(last_report().port)
    assert len(ports) == 3


def fail_in_rank1_while_rank0_waits_in_allreduce():
    import torch
    import torch.distributed as dist

    print(f"rank {dist.get_rank()} about to work", flush=True)
    if dist.get_rank() == 1:
        time.sleep(0.2)
        raise ValueError("bad batch in rank 1")
    dist.all_reduce(torch.ones(1))  # blocks: rank 1 never joins


def test_rank_crash_while_peer_blocks_in_allreduce_returns_within_5s_naming_the_rank():
    t0 = time.monotonic()
    with pytest.raises(WorkerError) as info:
        notebook_launcher(fail_in_rank1_while_rank0_waits_in_allreduce, num_processes=2)
    assert time.monotonic() - t0 < 5
    err = info.value
    assert err.rank == 1
    msg = str(err)
    assert "rank 1 failed: ValueError: bad batch in rank 1" in msg
    assert 'raise ValueError("bad batch in rank 1")' in msg  # the remote traceback
    assert "rank 1 about to work" in msg  # the tail of its output
    assert "kernelside/worker/" not in err.remote_traceback
    # rank 0 is either stopped by nblaunch or, if its all_reduce noticed the loss first, listed too
    assert "stopped by nblaunch: rank(s) 0" in msg or "also failed: rank 0:" in msg
    assert err.report.outcome == "failed"


def die_by(how):
    import signal

    import torch.distributed as dist

    if dist.get_rank() == 1:
        if how == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if how == "segv":
            import ctypes

            ctypes.string_at(0)
        if how == "exit3":
            os._exit(3)
    import torch

    dist.all_reduce(torch.ones(1))


@pytest.mark.parametrize(
    "how, expected",
    [
        ("sigkill", "killed by SIGKILL — out of memory?"),
        ("segv", "killed by SIGSEGV (segmentation fault)"),
        ("exit3", "exit code 3"),
    ],
)
def test_rank_death_is_named_and_returns_promptly(how, expected):
    t0 = time.monotonic()
    with pytest.raises(WorkerError) as info:
        notebook_launcher(die_by, args=(how,), num_processes=2)
    assert time.monotonic() - t0 < 5
    assert info.value.rank == 1
    assert expected in str(info.value)


def fail_everywhere():
    """Rank 0 fails first; the others fail once they are told to stop (the SIGTERM that rank 0's failure brings)."""
    import signal
    import threading

    import torch.distributed as dist

    rank = dist.get_rank()

    def broke(*_):
        raise RuntimeError(f"rank {rank} broke")

    signal.signal(signal.SIGTERM, broke)
    dist.barrier()  # every rank's handler is in place before rank 0 fails
    if rank == 0:
        raise RuntimeError("rank 0 broke")
    threading.Event().wait()  # until the stop that follows rank 0's failure


def test_exceptions_in_several_ranks_report_the_first_and_list_the_others():
    with pytest.raises(WorkerError) as info:
        notebook_launcher(fail_everywhere, num_processes=3)
    msg = str(info.value)
    assert info.value.rank == 0
    assert msg.startswith("nblaunch: rank 0 failed: RuntimeError: rank 0 broke")
    also = next(line for line in msg.splitlines() if line.startswith("also failed: "))
    assert "rank 1: RuntimeError: rank 1 broke" in also and "rank 2: RuntimeError: rank 2 broke" in also


def sleep_forever():
    while True:
        time.sleep(1)


def test_timeout_stops_every_rank_and_says_so():
    t0 = time.monotonic()
    with pytest.raises(LaunchTimeoutError) as info:
        notebook_launcher(sleep_forever, num_processes=2, timeout=1.5)
    assert 1.5 <= time.monotonic() - t0 < 5
    assert "exceeded timeout=1.5s" in str(info.value)


def test_max_restarts_runs_again_after_a_failure(tmp_path, capfd):
    marker = tmp_path / "failed-once"
    result = notebook_launcher(fail_first_time, args=(str(marker),), num_processes=2, max_restarts=1)
    assert result == "second attempt"
    assert "restarting all ranks (restart 1 of max_restarts=1)" in capfd.readouterr().err


def fail_first_time(marker):
    import torch.distributed as dist

    if not os.path.exists(marker):
        dist.barrier()
        if dist.get_rank() == 0:
            open(marker, "w").close()
            raise RuntimeError("first attempt fails")
        dist.barrier()
    return "second attempt"


class NotPicklable:
    def __reduce__(self):
        raise TypeError("holds an open socket")


def takes_model(model, lr):
    return lr


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"num_processes": 0}, "invalid num_processes=0"),
        ({"num_processes": 2, "mixed_precision": "fp9"}, "invalid mixed_precision='fp9'"),
        ({"num_processes": 2, "gpu_ids": "0"}, "GPU 0 is not present"),
        ({"num_processes": 2, "backend": "nccl"}, "backend='nccl' needs one GPU per rank"),
        ({"num_processes": 2, "start_method": "threads"}, "invalid start_method='threads'"),
        ({"num_processes": 2, "output": "some"}, "invalid output='some'"),
    ],
)
def test_bad_arguments_fail_before_any_process_starts(kwargs, fragment):
    with pytest.raises(LaunchConfigError) as info:
        notebook_launcher(whoami, **kwargs)
    assert fragment in str(info.value)


def test_non_callable_is_rejected():
    with pytest.raises(LaunchConfigError, match="invalid function=42"):
        notebook_launcher(42)


def test_unpicklable_argument_under_spawn_is_named():
    with pytest.raises(LaunchConfigError) as info:
        notebook_launcher(takes_model, args=(NotPicklable(), 0.1), num_processes=2, start_method="spawn")
    msg = str(info.value)
    assert "argument 'model' (args[0])" in msg and "holds an open socket" in msg
    assert "start_method='fork'" in msg


def test_multi_machine_arguments_say_what_is_missing():
    with pytest.raises(LaunchConfigError, match="num_machines=2 needs main_process_ip"):
        notebook_launcher(whoami, num_nodes=2, config=os.devnull)
    with pytest.raises(LaunchConfigError, match="invalid rdzv_endpoint='node0'"):
        notebook_launcher(whoami, num_nodes=2, rdzv_endpoint="node0", rdzv_backend="c10d")
    with pytest.raises(LaunchConfigError, match="invalid machine_rank=2"):
        notebook_launcher(whoami, num_nodes=2, node_rank=2, rdzv_endpoint="127.0.0.1:29500", rdzv_backend="c10d")


def talk(n):
    import subprocess

    import torch.distributed as dist

    r = dist.get_rank()
    for i in range(n):
        print("rank", r, "line", i, "x" * 50)
    os.write(1, f"C-level line from rank {r}\n".encode())
    subprocess.run(["echo", f"subprocess line from rank {r}"], check=True)
    print("partial ", end="")
    print("then whole", file=sys.stderr)


def test_output_all_prefixes_every_line_and_never_splits_one(capfd):
    notebook_launcher(talk, args=(300,), num_processes=2, output="all")
    out = capfd.readouterr().out
    lines = out.splitlines()
    for r in (0, 1):
        mine = [ln for ln in lines if ln.startswith(f"[rank {r}] rank {r} line")]
        assert len(mine) == 300
        assert all(ln == f"[rank {r}] rank {r} line {i} {'x' * 50}" for i, ln in enumerate(mine))
        assert f"[rank {r}] C-level line from rank {r}" in lines
        assert f"[rank {r}] subprocess line from rank {r}" in lines


def test_output_rank0_streams_c_level_and_subprocess_output_and_logs_the_rest(capfd):
    notebook_launcher(talk, args=(3,), num_processes=2)
    cap = capfd.readouterr()
    assert "C-level line from rank 0" in cap.out
    assert "subprocess line from rank 0" in cap.out
    assert "rank 1" not in cap.out
    assert "then whole" in cap.err
    log1 = open(last_report().ranks[1].log_path).read()
    assert "rank 1 line 2" in log1 and "subprocess line from rank 1" in log1


def test_output_none_shows_nothing_but_keeps_logs(capfd):
    notebook_launcher(talk, args=(3,), num_processes=2, output="none")
    cap = capfd.readouterr()
    assert "rank 0 line" not in cap.out
    assert "rank 0 line 1" in open(last_report().ranks[0].log_path).read()


def start_dataloader_children(pid_dir):
    import subprocess

    import torch.distributed as dist

    # a grandchild that would outlive its rank if nobody stopped its process group
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(os.path.join(pid_dir, f"child{dist.get_rank()}"), "w") as fh:
        fh.write(str(child.pid))
    dist.barrier()  # both ranks have a child before rank 1 fails
    if dist.get_rank() == 1:
        raise RuntimeError("rank 1 dies, leaving a child behind")
    time.sleep(600)


def test_failure_leaves_no_grandchild_process_behind(tmp_path):
    import psutil

    with pytest.raises(WorkerError):
        notebook_launcher(start_dataloader_children, args=(str(tmp_path),), num_processes=2)
    pids = [int(p.read_text()) for p in tmp_path.iterdir()]
    assert len(pids) == 2
    procs = []
    for pid in pids:  # orphans are re-parented away from us, so look them up by pid
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    # SIGKILL was sent to their process group before the call returned; wait for it to land
    _, alive = psutil.wait_procs(procs, timeout=5)
    assert [p for p in alive if p.status() != psutil.STATUS_ZOMBIE] == []


def flood(n):
    import torch.distributed as dist

    if dist.get_rank() == 0:
        for i in range(n):
            print(f"line {i:07d} " + "x" * 30)


class RecordingStream(io.StringIO):
    """Stands in for the cell's stream: records every write and every flush (one message each)."""

    def __init__(self):
        super().__init__()
        self.messages, self.pending = [], 0

    def write(self, text):
        self.pending += len(text)
        return super().write(text)

    def flush(self):
        self.messages.append(self.pending)
        self.pending = 0


def test_output_flood_shows_head_count_and_tail_within_budget_and_logs_every_line(monkeypatch):
    from kernelside.display import output

    cell = RecordingStream()
    monkeypatch.setattr(sys, "stdout", cell)
    t0 = time.monotonic()
    notebook_launcher(flood, args=(200_000,), num_processes=2)
    elapsed = time.monotonic() - t0
    shown = cell.getvalue().splitlines()
    log = open(last_report().ranks[0].log_path).read().splitlines()
    assert log == [f"line {i:07d} " + "x" * 30 for i in range(200_000)]  # nothing lost, in order
    lines = [ln for ln in shown if ln.startswith("line ")]
    notes = [ln for ln in shown if ln.startswith("[nblaunch: ")]
    assert lines[0] == log[0] and lines[-1] == log[-1]  # the head and the tail
    assert lines == sorted(lines)  # in order, none twice
    held = sum(int(n.split()[1]) for n in notes)
    assert len(lines) - 20 + held == 200_000  # every line is either shown or counted (20 shown at the end)
    assert notes[-1].endswith(f"{last_report().ranks[0].log_path}; the last 20:]")
    assert len(cell.getvalue()) <= output.SHOW_BURST_BYTES + output.SHOW_RATE_BYTES * elapsed + 10_000
    assert max(cell.messages + [cell.pending]) <= output.MAX_MESSAGE_BYTES + 1000
