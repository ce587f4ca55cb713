"""Lightning's Rich progress bar (its default when rich is installed) in a rank: no terminal control codes in the cell.

The kernel's FORCE_COLOR=1 reaches the ranks, so rich there believes it draws on a terminal and animates its bar with
cursor moves and line clears, which the cell shows as they are. The default bar becomes nblaunch's bar (as
TQDMProgressBar already does); a RichProgressBar asked for by name prints its finished bar once, as text.
"""

from __future__ import annotations

import pytest

FIT = """%%distributed -n 2 --return bar
import torch, lightning as L
from lightning.pytorch.callbacks import RichProgressBar
class Regressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)
    def training_step(self, batch, i):
        x, y = batch
        return torch.nn.functional.mse_loss(self.lin(x), y)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)
data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
trainer = L.Trainer(strategy="ddp", accelerator="cpu", devices=2, max_epochs=2, logger=False,
                    enable_checkpointing=False, enable_model_summary=False, callbacks={callbacks})
trainer.fit(Regressor(), torch.utils.data.DataLoader(data, batch_size=8))
bar = type(trainer.progress_bar_callback).__name__
"""
CONTROL = ("\x1b[2K", "\x1b[?25l", "\x1b[?25h", "\x1b[1A", "\r")


@pytest.fixture(scope="module")
def kernel(kernel_with, tmp_path_factory):
    k = kernel_with(cwd=tmp_path_factory.mktemp("rich_bar"))
    assert "FORCE_COLOR" in k.run("import os; print(sorted(os.environ))").ok().stdout  # what misleads rich
    return k


def _bars(cell):
    return [(s["max"], s["value"]) for s in cell.widget_states() if s["_model_name"] == "FloatProgressModel"]


def test_lightnings_default_rich_bar_becomes_nblaunchs_bar_without_control_codes(kernel):
    cell = kernel.run(FIT.format(callbacks="[]"), timeout=240).ok()
    assert kernel.run("print(bar)").ok().stdout == "TQDMProgressBar\n"
    assert _bars(cell) == [(4.0, 4.0)]  # rank 0's bar, drawn by the kernel: 4 steps an epoch
    shown = cell.stdout + cell.stderr
    assert not [c for c in CONTROL if c in shown], repr(shown[-500:])


def test_a_rich_bar_asked_for_by_name_prints_its_finished_bar_once_as_text(kernel):
    cell = kernel.run(FIT.format(callbacks="[RichProgressBar()]"), timeout=240).ok()
    assert kernel.run("print(bar)").ok().stdout == "RichProgressBar\n"
    shown = cell.stdout + cell.stderr
    assert not [c for c in CONTROL if c in shown], repr(shown[-500:])
    assert "Epoch 1/1" in shown and "4/4" in shown
