"""Lightning's own demos through `%%distributed` train to the weights Lightning's `ddp_notebook` gives, in one kernel.

`ddp_notebook` is Lightning's way to train on several processes from a notebook (it forks the kernel and loads rank
0's weights back into the notebook's model); `%%distributed -n 2` runs the same code with `strategy="ddp"` on ranks
that look like torchrun workers. Both start from the same seed on each rank, so after the same steps the weights are
the same. The demos: `BoringModel` and `LightningTransformer` (Lightning's transformer demo, on made-up tokens
instead of WikiText2, which it would download).
"""

from __future__ import annotations

import time

import pytest

SETUP = """
import torch, lightning as L
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.demos.transformer import LightningTransformer

class TinyTransformer(LightningTransformer):
    def prepare_data(self):  # the demo downloads WikiText2 here; the data below is made up
        pass

def demo(name):
    L.seed_everything(0, verbose=False)
    if name == "boring":
        return BoringModel(), None
    tokens = torch.randint(0, 64, (64, 9), generator=torch.Generator().manual_seed(1))
    data = torch.utils.data.TensorDataset(tokens[:, :-1], tokens[:, 1:])
    return TinyTransformer(vocab_size=64), torch.utils.data.DataLoader(data, batch_size=8)

def fit(name, strategy):
    model, loader = demo(name)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy=strategy, max_steps=4, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, loader)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}
"""


@pytest.fixture(scope="module")
def kernel(kernel_with, tmp_path_factory):
    return kernel_with(SETUP, cwd=tmp_path_factory.mktemp("lightning_demos"))


@pytest.mark.parametrize("demo", ["boring", "transformer"])
def test_lightning_demo_in_a_distributed_cell_gives_the_weights_of_ddp_notebook(demo, kernel):
    t0 = time.monotonic()
    kernel.run(f"reference = fit({demo!r}, 'ddp_notebook')", timeout=300).ok()
    t1 = time.monotonic()
    kernel.run(f"%%distributed -n 2 --return weights\nweights = fit({demo!r}, 'ddp')", timeout=300).ok()
    print(f"{demo}: ddp_notebook {t1 - t0:.1f} s, %%distributed {time.monotonic() - t1:.1f} s")
    same = kernel.run(
        f"changed = any(not torch.equal(v, demo({demo!r})[0].state_dict()[k]) for k, v in reference.items())\n"
        "print(sorted(weights) == sorted(reference), changed,"
        " all(torch.allclose(weights[k], reference[k], atol=1e-6) for k in reference))"
    ).ok()
    # the same keys; ddp_notebook's training did change the weights (so the comparison means something); equal
    assert same.stdout == "True True True\n"
