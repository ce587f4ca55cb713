"""Sharded models and DTensors come back whole into a real kernel, from real ranks (gloo, 2 CPU workers)."""

from __future__ import annotations

import time

import pytest

SETUP = """
import pickle, time
import torch
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, fully_shard
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard, Replicate, distribute_tensor

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 7)          # 7 rows: an uneven split over 2 ranks
        self.b = nn.Linear(7, 3)
        self.register_buffer("scale", torch.full((3,), 2.0))
    def forward(self, x):
        return self.b(torch.relu(self.a(x))) * self.scale

def train(model, steps=3):
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    torch.manual_seed(1)
    for _ in range(steps):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
    return opt

def no_dist_refs(obj):
    # what reaches the kernel holds no process group, device mesh or FSDP state: it pickles as plain objects
    text = str(pickle.dumps(obj))
    return not any(w in text for w in ("ProcessGroup", "DeviceMesh", "FSDPState", "DTensor", "FlatParameter"))
"""


@pytest.fixture(scope="module")
def kernel(kernel_with):
    return kernel_with(SETUP)


def _lines(cell) -> list[str]:
    return cell.stdout.split()


def test_fsdp2_model_comes_back_as_the_plain_class_with_the_ranks_full_tensors(kernel):
    kernel.run("""%%distributed -n 2 --return model,full,rank0_shard
torch.manual_seed(0)
model = Net()
fully_shard(model.a); fully_shard(model.b); fully_shard(model)
train(model)
full = {n: p.full_tensor() for n, p in model.named_parameters()}
rank0_shard = model.a.weight.to_local().shape[0]
""").ok()
    check = kernel.run("""
print(type(model) is Net, type(model.a) is nn.Linear, rank0_shard)
print(all(type(p) is nn.Parameter and p.requires_grad for p in model.parameters()))
print(all(torch.equal(p, full[n]) for n, p in model.named_parameters()), list(model.a.weight.shape))
print(torch.equal(model.scale, torch.full((3,), 2.0)), no_dist_refs(model))
print(len(model._forward_pre_hooks) + len(model.a._forward_pre_hooks) + len(model.a._state_dict_pre_hooks))
print(list(model(torch.randn(5, 4)).shape))
""").ok()
    assert _lines(check) == ["True", "True", "4", "True", "True", "[7,", "4]", "True", "True", "0", "[5,", "3]"]


def test_fsdp1_model_comes_back_unwrapped_with_the_full_parameters(kernel):
    kernel.run("""%%distributed -n 2 --return model,full
torch.manual_seed(0)
model = FSDP(Net(), device_id=torch.device("cpu"), auto_wrap_policy=ModuleWrapPolicy({nn.Linear}))
train(model)
with FSDP.summon_full_params(model):
    full = {n.replace("_fsdp_wrapped_module.", ""): p.detach().clone() for n, p in model.named_parameters()}
""").ok()
    check = kernel.run("""
print(type(model) is Net, type(model.a) is nn.Linear, sorted(full) == sorted(n for n, _ in model.named_parameters()))
print(all(type(p) is nn.Parameter for p in model.parameters()))
print(all(torch.equal(p, full[n]) for n, p in model.named_parameters()), no_dist_refs(model))
print(list(model(torch.randn(5, 4)).shape), sorted(model.state_dict()))
""").ok()
    assert _lines(check) == [
        "True",
        "True",
        "True",
        "True",
        "True",
        "True",
        "[5,",
        "3]",
        "['a.bias',",
        "'a.weight',",
        "'b.bias',",
        "'b.weight',",
        "'scale']",
    ]


def test_returned_dtensor_is_the_full_plain_tensor_not_rank0s_shard(kernel):
    cell = kernel.run("""%%distributed -n 2
mesh = init_device_mesh("cpu", (2,))
dt = distribute_tensor(torch.arange(8.0).reshape(4, 2), mesh, [Shard(0)])
dt
""").ok()
    assert "DTensor" not in cell.result["text/plain"]
    check = kernel.run("d = _\nprint(type(d) is torch.Tensor, torch.equal(d, torch.arange(8.0).reshape(4, 2)))").ok()
    assert _lines(check) == ["True", "True"]


def test_partial_dtensor_comes_back_reduced_and_fsdp_on_a_submodule_only_comes_back_whole(kernel):
    cell = kernel.run("""%%distributed -n 2 --return partial,model
from torch.distributed.tensor import Partial
partial = DTensor.from_local(torch.full((2, 2), float(rank + 1)), init_device_mesh("cpu", (2,)), [Partial()])
model = Net()
fully_shard(model.a)                    # the root is left plain; the cell's result is model.a, shared with model
""").ok()
    assert cell.result["text/plain"] == "Linear(in_features=4, out_features=7, bias=True)"
    check = kernel.run(
        "print(torch.equal(partial, torch.full((2, 2), 3.0)), type(model.a) is nn.Linear, list(model.a.weight.shape),"
        " type(model.a.weight) is nn.Parameter, no_dist_refs(model))"
    ).ok()
    assert _lines(check) == ["True", "True", "[7,", "4]", "True", "True"]


def test_state_dicts_of_dtensors_come_back_as_full_tensors(kernel):
    kernel.run("""%%distributed -n 2 --return sd,osd,shapes,mixed
torch.manual_seed(0)
model = Net()
fully_shard(model.a); fully_shard(model)
opt = train(model)
sd, osd = model.state_dict(), opt.state_dict()
shapes = {n: list(p.shape) for n, p in model.named_parameters()}
mesh = model.a.weight.device_mesh
mixed = [distribute_tensor(torch.ones(2, 3), mesh, [Replicate()]), (7, "text", {"t": torch.zeros(1)})]
""").ok()
    check = kernel.run("""
print(all(type(v) is torch.Tensor for v in sd.values()), {n: list(sd[n].shape) for n in shapes} == shapes)
states = list(osd["state"].values())
print(all(type(t) is torch.Tensor for s in states for t in s.values()))
print(sorted(list(s["exp_avg"].shape) for s in states) == sorted(shapes.values()))
print(type(mixed[0]) is torch.Tensor, torch.equal(mixed[0], torch.ones(2, 3)), mixed[1][:2], no_dist_refs([sd, osd]))
""").ok()
    assert _lines(check) == ["True", "True", "True", "True", "True", "True", "(7,", "'text')", "True"]


def test_return_all_gives_every_rank_the_whole_fsdp1_and_fsdp2_models(kernel):
    check = kernel.run("""
from kernelside import notebook_launcher
def both():
    torch.manual_seed(0)
    one = FSDP(Net(), device_id=torch.device("cpu"))
    two = Net()
    fully_shard(two)
    return one, two
got = notebook_launcher(both, num_processes=2, return_all=True)
print([type(m).__name__ for pair in got for m in pair])
print(all(torch.equal(p, q) for p, q in zip(got[0][0].parameters(), got[1][0].parameters())))
print(all(torch.equal(p, q) for p, q in zip(got[0][1].parameters(), got[1][1].parameters())))
print([list(m.a.weight.shape) for pair in got for m in pair] == [[7, 4]] * 4)
""").ok()
    assert _lines(check) == ["['Net',", "'Net',", "'Net',", "'Net']", "True", "True", "True"]


def test_a_rank_failing_during_the_gather_is_named_within_seconds(kernel):
    check = kernel.run("""
t0 = time.monotonic()
try:
    get_ipython().run_cell_magic("distributed", "-n 2 --return model", '''
model = FSDP(Net(), device_id=torch.device("cpu"), auto_wrap_policy=ModuleWrapPolicy({nn.Linear}))
def full_disk(module, prefix, keep_vars):
    raise OSError("no space left on rank 1")
if rank == 1:
    model.b.register_state_dict_pre_hook(full_disk)   # runs while rank 0 waits in the next all-gather
''')
except Exception as e:
    print(type(e).__name__, round(time.monotonic() - t0, 1))
    print(str(e).splitlines()[0])
""").ok()
    kind, seconds = check.stdout.splitlines()[0].split()
    assert kind == "WorkerError" and float(seconds) < 8.0, check.stdout
    assert "rank 1 failed during result gather: OSError: no space left on rank 1" in check.stdout


def test_only_rank0_returning_a_sharded_value_is_a_clear_error_not_a_hang(kernel):
    t0 = time.monotonic()
    check = kernel.run("""
from kernelside import notebook_launcher
def rank0_only():
    import torch.distributed as dist
    dt = distribute_tensor(torch.ones(4, 2), init_device_mesh("cpu", (2,)), [Shard(0)])
    return dt if dist.get_rank() == 0 else None
try:
    notebook_launcher(rank0_only, num_processes=2)
except Exception as e:
    print(str(e).splitlines()[0])
""").ok()
    assert time.monotonic() - t0 < 30
    assert "rank 0 failed during result gather: ShardedResultError: the ranks return different sharded" in check.stdout
    assert "a DTensor of shape [4, 2] (torch.float32) at result where rank 1 returns nothing sharded" in check.stdout


def test_tensor_parallel_module_is_refused_with_what_to_return_instead(kernel):
    cell = kernel.run("""%%distributed -n 2 --return tp
from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module
tp = parallelize_module(nn.Sequential(nn.Linear(4, 8)), init_device_mesh("cpu", (2,)), {"0": ColwiseParallel()})
""")
    text = "\n".join(cell.error["traceback"])
    assert "ShardedResultError: tp.0 (Linear) is tensor-parallel" in text
    assert "Return its state dict instead (tp.0.state_dict()" in text
    # and the state dict it suggests does come back whole
    kernel.run("""%%distributed -n 2 --return sd
from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module
torch.manual_seed(0)
plain = nn.Sequential(nn.Linear(4, 8))
expected = {k: v.clone() for k, v in plain.state_dict().items()}
sd = parallelize_module(plain, init_device_mesh("cpu", (2,)), {"0": ColwiseParallel()}).state_dict()
""").ok()
    check = kernel.run("print({k: list(v.shape) for k, v in sd.items()}, type(sd['0.weight']).__name__)").ok()
    assert check.stdout == "{'0.weight': [8, 4], '0.bias': [8]} Tensor\n"


def test_plain_results_are_untouched_and_ddp_still_unwraps(kernel):
    check = kernel.run("""%%distributed -n 2 --return model,stats
from torch.nn.parallel import DistributedDataParallel as DDP
model = DDP(Net())
stats = {"losses": [1.0, 0.5], "t": torch.ones(2)}
""").ok()
    check = kernel.run("print(type(model).__name__, stats['losses'], stats['t'].tolist())").ok()
    assert check.stdout == "Net [1.0, 0.5] [1.0, 1.0]\n"


# -- live ranks: the agreement is keyed by the cell, and the kernel keeps no record of it -------------------------
STORE_KEYS = "from kernelside.live.session import current\nprint(current().world.store.num_keys())"


@pytest.fixture
def live(kernel):
    kernel.run("%distributed_start -n 2").ok()
    yield kernel
    kernel.run("%distributed_stop").ok()


def test_a_live_rank_that_failed_a_cell_its_peer_ended_still_agrees_with_it_on_the_next_sharded_value(live):
    failed = live.run("%%distributed\nif rank == 1:\n    time.sleep(0.5)\n    raise ValueError('rank 1 only')")
    assert "rank 1 failed: ValueError: rank 1 only" in "\n".join(failed.error["traceback"])
    t0 = time.monotonic()
    cell = live.run(
        "%%distributed\ndt = distribute_tensor(torch.arange(8.0).reshape(4, 2), init_device_mesh('cpu', (2,)), "
        "[Shard(0)])\ndt",
        timeout=60,
    ).ok()  # (rank 0 had agreed once more than rank 1: counted per process, the two waited on different records)
    assert time.monotonic() - t0 < 30
    check = live.run("print(type(_) is torch.Tensor, torch.equal(_, torch.arange(8.0).reshape(4, 2)))").ok()
    assert _lines(check) == ["True", "True"], cell.outputs


def test_a_live_sharded_value_on_rank_0_only_is_a_clear_error_and_the_ranks_keep_their_state(live):
    live.run("%%distributed\nkept = rank + 40\nmesh = init_device_mesh('cpu', (2,))").ok()
    t0 = time.monotonic()
    cell = live.run(
        "%%distributed\ndt = distribute_tensor(torch.ones(4, 2), mesh, [Shard(0)])\ndt if rank == 0 else None"
    )
    text = "\n".join(cell.error["traceback"])
    assert time.monotonic() - t0 < 30
    assert "ShardedResultError: the ranks return different sharded values: rank 0 returns a DTensor" in text
    assert "rank 1 returns nothing sharded there" in text
    after = live.run("%%distributed --return-from all --return kept\npass").ok()
    assert live.run("print(kept)").ok().stdout == "[40, 41]\n", after.outputs


def test_live_cells_leave_no_record_of_their_agreement_in_the_kernels_store(live):
    live.run("%%distributed\nx = 1").ok()
    before = int(live.run(STORE_KEYS).ok().stdout)
    for _ in range(5):
        live.run("%%distributed\nx = rank").ok()
    live.run("%%distributed\ndistribute_tensor(torch.ones(4, 2), init_device_mesh('cpu', (2,)), [Shard(0)])").ok()
    assert int(live.run(STORE_KEYS).ok().stdout) == before  # (two records a cell, for the session's life, before)
