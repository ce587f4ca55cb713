"""A rank looks like a torchrun worker: Lightning, Accelerate and friends take their script paths there,
even after the notebook imported them and made their objects first. Plus the two failure messages
that only make sense from inside a rank: a nested launch, and a rank that left on its own."""

from __future__ import annotations

import pytest

LIGHTNING_MODULE = """
import torch, lightning as L
class Regressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)
    def training_step(self, batch, i):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.lin(x), y)
        self.log("loss", loss)
        return loss
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)
"""


@pytest.fixture(scope="module")
def kernel(kernel_with, tmp_path_factory):
    # the notebook imports the libraries first: their import-time view of the kernel is what ranks inherit
    return kernel_with(
        "import sys, lightning\nfrom kernelside import notebook_launcher, last_report",
        cwd=tmp_path_factory.mktemp("identity"),  # Lightning writes lightning_logs/ here
    )


def test_ranks_have_no_interactive_shell_markers_even_though_the_kernel_has(kernel):
    kernel_side = kernel.run("print(hasattr(sys, 'ps1'), get_ipython() is not None)").ok()
    assert kernel_side.stdout == "True True\n"
    cell = kernel.run("""%%distributed -n 2
import builtins, lightning.fabric.utilities.imports as li
print(rank, hasattr(sys, "ps1"), get_ipython(), hasattr(builtins, "__IPYTHON__"), li._IS_INTERACTIVE)
""").ok()
    assert cell.stdout == "0 False None False False\n"


def test_fabric_ddp_launch_runs_under_fork_with_world_size_2_and_no_extra_processes(kernel):
    template = kernel.template_pid()  # the forkserver template a GPU machine starts is no extra process
    cell = kernel.run(
        f"""%%distributed -n 2 --start-method fork --return seen --return-from all
import os, psutil, torch
from lightning.fabric import Fabric
fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
fabric.launch()
t = fabric.all_reduce(torch.tensor([1.0]), reduce_op="sum")
kernel_children = [c for c in psutil.Process(os.getppid()).children() if c.pid != {template}]
seen = (fabric.global_rank, fabric.world_size, t.item(), len(kernel_children), len(psutil.Process().children()))
""",
        timeout=180,
    ).ok()
    assert "not compatible with an interactive" not in cell.stdout + cell.stderr
    seen = kernel.run("print(seen)").ok().stdout
    # rank, world size, the sum over both ranks, the kernel's children (the 2 ranks), each rank's own (none)
    assert seen == "[(0, 2, 2.0, 2, 0), (1, 2, 2.0, 2, 0)]\n"


def test_lightning_trainer_fit_with_ddp_runs_under_fork_on_both_ranks(kernel):
    kernel.run(LIGHTNING_MODULE).ok()
    template = kernel.template_pid()  # the forkserver template a GPU machine starts is no extra process
    cell = kernel.run(
        f"""%%distributed -n 2 --start-method fork --return seen --return-from all
import os, psutil
data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
trainer = L.Trainer(strategy="ddp", accelerator="cpu", devices=2, max_epochs=2, logger=False,
                    enable_checkpointing=False, enable_model_summary=False, enable_progress_bar=False)
trainer.fit(Regressor(), torch.utils.data.DataLoader(data, batch_size=8))
seen = (trainer.global_rank, trainer.world_size, trainer.global_step,
        len([c for c in psutil.Process(os.getppid()).children() if c.pid != {template}]))
""",
        timeout=240,
    ).ok()
    assert "MisconfigurationException" not in cell.stderr
    # 64 samples, 8 per batch, split over 2 ranks: 4 steps an epoch on each rank, 2 epochs
    assert kernel.run("print(seen)").ok().stdout == "[(0, 2, 8, 2), (1, 2, 8, 2)]\n"


def test_accelerator_made_in_the_kernel_first_does_not_make_the_ranks_non_distributed(kernel):
    kernel.run("from accelerate import Accelerator\nkernel_acc = Accelerator()").ok()
    assert kernel.run("print(kernel_acc.distributed_type, kernel_acc.num_processes)").ok().stdout == (
        "DistributedType.NO 1\n"
    )
    kernel.run("""%%distributed -n 2 --return seen --return-from all
import torch
acc = Accelerator()
t = acc.reduce(torch.tensor([float(acc.process_index)]), reduction="sum")
seen = (str(acc.distributed_type), acc.num_processes, acc.process_index, t.item())
""").ok()
    assert kernel.run("print(seen)").ok().stdout == (
        "[('DistributedType.MULTI_CPU', 2, 0, 1.0), ('DistributedType.MULTI_CPU', 2, 1, 1.0)]\n"
    )
    # and the kernel's own Accelerator is untouched
    assert kernel.run("print(kernel_acc.distributed_type)").ok().stdout == "DistributedType.NO\n"


def test_a_launch_from_inside_a_rank_says_it_cannot_be_started_there(kernel):
    kernel.run("def inner():\n    return 1\ndef outer():\n    return notebook_launcher(inner, num_processes=2)").ok()
    cell = kernel.run("notebook_launcher(outer, num_processes=2)")
    text = "\n".join(cell.error["traceback"])
    assert "a launch cannot be started from inside a rank" in text
    assert "another nblaunch launch is already running" not in text


def test_rank_leaving_with_sys_exit_0_during_a_peer_collective_is_named_as_the_root_cause(kernel):
    cell = kernel.run("""%%distributed -n 2
import torch, torch.distributed as dist
if rank == 1:
    sys.exit(0)
t = torch.ones(1)
dist.all_reduce(t)
""")
    assert cell.error is not None and cell.error["ename"] == "WorkerError"
    text = "\n".join(cell.error["traceback"])
    first_line = text.splitlines()[0]
    assert "rank 1 left on its own (sys.exit(0) at <%%distributed cell" in first_line
    assert "line 4; exit code 0) before rank 0's collective finished" in first_line
    assert "rank 0 was still waiting for it and then failed" in text
    assert "stopped by nblaunch" not in text
    last = kernel.run("%distributed_last").ok().result["text/plain"]
    rank1 = next(line for line in last.splitlines() if line.strip().startswith("rank 1:"))
    assert "exit code 0 (left on its own: sys.exit(0) at <%%distributed cell" in rank1
    assert "SIGTERM" not in rank1


def test_lightning_tqdm_bar_made_in_the_kernel_draws_nblaunch_bars_not_widgets_from_the_rank(kernel):
    kernel.run(LIGHTNING_MODULE + "from lightning.pytorch.callbacks import TQDMProgressBar").ok()
    cell = kernel.run(
        """%%distributed -n 2
data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
trainer = L.Trainer(strategy="ddp", accelerator="cpu", devices=2, max_epochs=2, logger=False,
                    enable_checkpointing=False, enable_model_summary=False, callbacks=[TQDMProgressBar()])
trainer.fit(Regressor(), torch.utils.data.DataLoader(data, batch_size=8))
""",
        timeout=240,
    ).ok()
    bars = [s for s in cell.widget_states() if s["_model_name"] == "FloatProgressModel"]
    # one bar (rank 0's), drawn by the kernel: 4 steps an epoch
    assert [(b["max"], b["value"]) for b in bars] == [(4.0, 4.0)]
    # nothing else was displayed: no notebook bar of the rank's own (its widget, or its text stand-in)
    others = [
        c
        for k, c in cell.outputs
        if k == "display_data" and "application/vnd.jupyter.widget-view+json" not in c["data"]
    ]
    assert others == []


def test_a_widget_made_in_a_rank_never_writes_on_the_kernels_sockets(kernel):
    cell = kernel.run("""%%distributed -n 2
import ipywidgets
from IPython.display import display
slider = ipywidgets.IntSlider(value=7, description="from rank")
display(slider)
""").ok()
    assert not any(s["_model_name"] == "IntSliderModel" for s in cell.widget_states())
    shown = [c["data"] for k, c in cell.outputs if k == "display_data" and "IntSlider" in c["data"]["text/plain"]]
    assert shown == [{"text/plain": "IntSlider(value=7, description='from rank')"}]


def _in_child(fn) -> str:
    import os

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.write(w, repr(fn()).encode())
        finally:
            os._exit(0)
    os.close(w)
    got = os.read(r, 10000).decode()
    os.close(r)
    os.waitpid(pid, 0)
    return got


def test_a_rank_forked_after_the_parents_look_resets_lightnings_flags_and_one_imported_since(monkeypatch):
    import sys
    import types

    from kernelside.worker import rank_identity

    before = types.ModuleType("lightning.nblaunch_test_before")
    before._IS_INTERACTIVE = True
    monkeypatch.setitem(sys.modules, before.__name__, before)
    rank_identity.prime()  # the kernel, just before it forks

    def child():
        looked = [before._IS_INTERACTIVE]
        rank_identity.become_launched_worker(1)  # nothing imported since the look: the parent's list of modules
        looked.append(before._IS_INTERACTIVE)
        before._IS_INTERACTIVE = True
        since = types.ModuleType("lightning_fabric.nblaunch_test_since")
        since._IS_INTERACTIVE = True
        sys.modules[since.__name__] = since  # imported after the look: every module is walked again
        rank_identity.become_launched_worker(1)
        return looked + [before._IS_INTERACTIVE, since._IS_INTERACTIVE]

    assert _in_child(child) == repr([True, False, False, False])
