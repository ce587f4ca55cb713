"""The shipped notebooks run top to bottom in a real kernel, and a mixed notebook runs twice."""

from __future__ import annotations

import importlib.util
import os

import pytest
from kernel import REPO

spec = importlib.util.spec_from_file_location("execute_nb", os.path.join(REPO, "notebooks", "execute.py"))
execute_nb = importlib.util.module_from_spec(spec)
spec.loader.exec_module(execute_nb)

pytestmark = pytest.mark.kernel  # every test here runs a notebook in a kernel (nbclient, papermill)


def _text(nb) -> str:
    return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)


def test_quickstart_trains_on_two_workers_and_shows_bars_and_a_loss_chart(tmp_path):
    out, nb = execute_nb.execute(os.path.join(REPO, "notebooks", "quickstart.ipynb"), str(tmp_path))
    text = _text(nb)
    assert "rank 0/2: 64 steps" in text and "rank 1/2" not in text
    assert "Net 64 losses" in text
    state = nb.metadata.widgets["application/vnd.jupyter.widget-state+json"]["state"]
    epoch = [
        m["state"]
        for m in state.values()
        if m["model_name"] == "FloatProgressModel" and m["state"]["description"] == "epoch"
    ]
    assert epoch and epoch[0]["value"] == 4.0
    assert any(
        m["state"].get("value", "").startswith('<div class="nblaunch-chart"') and "loss: last" in m["state"]["value"]
        for m in state.values()
        if m["model_name"] == "HTMLModel"
    )
    assert os.path.exists(out)
    # it ends with what it promises: the report with each rank's log linked, then the metrics history
    last_html = nb.cells[-3].outputs[0]["data"]["text/html"]
    assert last_html.count('class="nblaunch-log-link"') == 2 and "rank1.log</a>" in last_html
    history = nb.cells[-1].outputs
    assert "32 points, loss from" in history[0]["text"] and "<table" in history[1]["data"]["text/html"]


def test_accelerate_notebook_sees_multi_cpu_two_processes_bf16(tmp_path):
    _, nb = execute_nb.execute(os.path.join(REPO, "notebooks", "accelerate.ipynb"), str(tmp_path))
    text = _text(nb)
    assert "DistributedType.MULTI_CPU, 2 processes, bf16" in text
    assert "final loss (mean over ranks)" in text


def test_lightning_notebook_fits_on_two_ranks_with_nblaunch_bars_and_a_figure(tmp_path):
    _, nb = execute_nb.execute(os.path.join(REPO, "notebooks", "lightning.ipynb"), str(tmp_path))
    text = _text(nb)
    # 512 samples over 2 ranks, 32 a batch: 8 steps an epoch, 5 epochs; only rank 0's line shows
    assert "rank 0 of 2: 40 steps" in text and "rank 1 of 2" not in text
    assert "the returned model's MSE on all data" in text
    launch_cell = next(c for c in nb.cells if c.cell_type == "code" and c.source.startswith("%%distributed"))
    pngs = [o for o in launch_cell.outputs if o.get("output_type") == "display_data" and "image/png" in o["data"]]
    assert len(pngs) == 1  # rank 0's plt.show(), stored in the notebook
    state = nb.metadata.widgets["application/vnd.jupyter.widget-state+json"]["state"]
    bars = [m["state"] for m in state.values() if m["model_name"] == "FloatProgressModel"]
    assert [(b["max"], b["value"]) for b in bars] == [(8.0, 8.0)]  # Lightning's bar, drawn by nblaunch


MIXED = [
    "%load_ext kernelside",
    "import torch\nbase = torch.arange(4.0)",
    "%%distributed -n 2 --return part\npart = base[rank::world_size].sum().item()",
    "total = part * 2\nprint('total', total)",
    "def scale(x):\n    return x * 10",
    "%%distributed -n 2 --return scaled --return-from all\nscaled = scale(rank + 1)",
    "print('scaled', scaled)",
    "%%distributed -n 3\nimport torch.distributed as dist\nt = torch.tensor([1.0])\ndist.all_reduce(t)\nint(t.item())",
    "from kernelside import notebook_launcher\nprint('fn', notebook_launcher(scale, args=(4,), num_processes=2))",
    "%distributed_last",
]


@pytest.mark.timeout(300)
def test_ten_cell_mixed_notebook_runs_top_to_bottom_twice_in_one_kernel(tmp_path, new_kernel):
    k = new_kernel(load_ext=False, cwd=str(tmp_path))
    for round_ in range(2):
        cells = [k.run(code).ok() for code in MIXED]
        assert cells[3].stdout == "total 4.0\n"
        assert cells[6].stdout == "scaled [10, 20]\n"
        assert cells[7].result["text/plain"] == "3"
        assert cells[8].stdout == "fn 40\n"
        assert "outcome='ok'" in cells[9].result["text/plain"], round_


def test_papermill_runs_a_magic_notebook_with_parameters(tmp_path):
    import nbformat
    import papermill

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    params = nbformat.v4.new_code_cell("workers = 2")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [
        params,
        nbformat.v4.new_code_cell("%load_ext kernelside"),
        nbformat.v4.new_code_cell("%%distributed -n $workers --return got\ngot = world_size"),
        nbformat.v4.new_code_cell("print('papermill world', got, workers)"),
    ]
    src, out = tmp_path / "in.ipynb", tmp_path / "out.ipynb"
    nbformat.write(nb, src)
    papermill.execute_notebook(
        str(src), str(out), parameters={"workers": 5}, kernel_name="python3", cwd=str(tmp_path), progress_bar=False
    )
    done = nbformat.read(out, 4)
    # the injected parameter reaches the magic's flags through IPython's $name expansion
    assert done.cells[-1].outputs[0]["text"] == "papermill world 5 5\n"


def test_live_ranks_notebook_keeps_the_model_across_cells_and_survives_a_failure(tmp_path):
    _, nb = execute_nb.execute(os.path.join(REPO, "notebooks", "live_ranks.ipynb"), str(tmp_path))
    text = _text(nb)
    assert "live session up in" in text and "model built on 2 ranks" in text
    assert "step 80, loss" in text  # the second training cell went on from the first
    assert "rank 0 weight norm" in text and "rank 1 weight norm" not in text
    assert "WorkerError nblaunch: rank 1 failed: ValueError: rank 1 fails on purpose" in text
    assert "still at step 80" in text and "live session stopped; nothing is left running" in text
    # a bad batch on rank 1 while rank 0 waits in backward: only the cell is lost, training goes on, %debug answers
    errors = "".join(
        "\n".join(o.traceback) for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.get("traceback")
    )
    assert "rank 1 failed: RuntimeError: mat1 and mat2 shapes cannot be multiplied" in errors
    assert "every rank kept its state" in errors and "training went on to step 90" in text
    # %debug is taught as a cell run on purpose: a Run All (JupyterLab's, make demo's) never waits at its prompt
    debug = next(c for c in nb.cells if c.cell_type == "code" and "%debug" in c.source)
    assert debug.source.splitlines()[-1] == "# %debug" and debug.outputs == []
    assert any("(rank 1) (Pdb)" in c.source and "on purpose" in c.source for c in nb.cells if c.cell_type == "markdown")
    assert "live session stopped; nothing is left running" in text  # ...and Run All reached the end


def test_sharded_and_loggers_notebook_returns_the_whole_fsdp_model_and_charts_writer_and_trainer_logs(tmp_path):
    _, nb = execute_nb.execute(os.path.join(REPO, "notebooks", "sharded_and_loggers.ipynb"), str(tmp_path))
    text = _text(nb)
    assert "rank 0: holds 32 of 64 rows of layer 0" in text  # a shard on the rank...
    assert "Net [64, 16] mse on all data" in text  # ...the whole model in the notebook
    assert "TensorBoard event files in" in text and ": 1" in text
    assert "'grad_norm'" in text and "'learning_rate'" in text and "'train/loss'" not in text
    state = nb.metadata.widgets["application/vnd.jupyter.widget-state+json"]["state"]
    charts = [m["state"]["value"] for m in state.values() if m["model_name"] == "HTMLModel"]
    charts = [c for c in charts if c.startswith('<div class="nblaunch-chart"')]
    assert any("train/loss: last" in c and "(150 points)" in c and "train/lr: last" in c for c in charts)
    assert any("grad_norm: last" in c and "(20 points)" in c and "train_runtime</b>" in c for c in charts)


def test_deepspeed_notebook_runs_deepspeed_engine_from_the_config_and_from_a_plugin_and_refuses_fp16(tmp_path):
    _, nb = execute_nb.execute(os.path.join(REPO, "notebooks", "deepspeed.ipynb"), str(tmp_path))
    text = _text(nb)
    assert "DeepSpeedEngine with DeepSpeedZeroOptimizer on 2 ranks" in text
    assert "ZeRO-2 losses: [" in text
    assert "DeepSpeedEngine with DeepSpeedZeroOptimizer_Stage3" in text
    assert "refused: DeepSpeed on CPU runs fp16 only where" in text or "fp16 ran: this CPU has fp16 kernels" in text
