"""The loggers training code already calls draw the live chart: a real kernel (nbclient, widget state
stored), real ranks (gloo, 2 CPU workers), real Accelerate, transformers, Lightning, TensorBoard and WandB (offline)."""

from __future__ import annotations

import ast
import glob
import struct
import textwrap

import nbformat
import pytest
from nbclient import NotebookClient

SETUP = """
%load_ext kernelside
import os, sys, tempfile
import torch
from torch.utils.tensorboard import SummaryWriter     # imported in the kernel: the ranks inherit it
from kernelside import last_report, log_metrics
tb_dir = tempfile.mkdtemp()
def summary(label):
    r = last_report()
    print(label, repr(r.metrics))
print("kernel imported", [m for m in ("transformers", "lightning") if m in sys.modules])
"""

ACCELERATE = """
%%distributed -n 2
from accelerate import Accelerator
accelerator = Accelerator()                           # no init_trackers: nothing else would see these
for step in range(1, 41):
    accelerator.log({"loss": 1.0 / step**2, "lr": torch.tensor(1e-3), "note": "text is left out"}, step=step)
"""

ACCELERATE_TRACKER = """
%%distributed -n 2
from accelerate import Accelerator
accelerator = Accelerator(log_with="tensorboard", project_dir=tb_dir)
accelerator.init_trackers("acc")
for step in range(5):
    accelerator.log({"acc_loss": 2.0 - 0.25 * step}, step=step)
accelerator.end_training()
"""

WRITER = """
%%distributed -n 2
writer = SummaryWriter(os.path.join(tb_dir, f"sw{rank}"))
for step in range(10):
    writer.add_scalar("train/loss", 3.0 - 0.2 * step, step)
writer.add_scalars("eval", {"acc": 0.9, "f1": 0.8}, 9)
writer.close()
"""

TRAINER = """
%%distributed -n 2
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=64, n_positions=16,
                                   bos_token_id=0, eos_token_id=0))
data = [{"input_ids": torch.randint(0, 64, (16,)), "labels": torch.randint(0, 64, (16,))} for _ in range(32)]
seen = []
class Spy(TrainerCallback):
    def on_log(self, args, state, control, logs=None, **kwargs):
        seen.append(dict(logs))
os.environ["TENSORBOARD_LOGGING_DIR"] = os.path.join(tb_dir, f"hf{rank}")
args = TrainingArguments(output_dir=tempfile.mkdtemp(), max_steps=4, logging_steps=1, per_device_train_batch_size=2,
                         report_to=["tensorboard"], use_cpu=True, save_strategy="no", disable_tqdm=True)
Trainer(model=model, args=args, train_dataset=data, callbacks=[Spy()]).train()
print("callback saw", len(seen), sorted(seen[0]))
"""

# spawn: the capture must also patch a Lightning that the rank imports afresh, as a script would (fork,
# where the ranks inherit the kernel's Lightning, is tests/test_rank_identity.py's); real DDP over 2 ranks
LIGHTNING = """
%%distributed -n 2 --start-method spawn
import tempfile, torch
import lightning as L
class Regression(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)
    def training_step(self, batch, i):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.lin(x), y)
        self.log("train_loss", loss)
        return loss
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)
data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=6, log_every_n_steps=1,
                    enable_checkpointing=False, enable_model_summary=False, enable_progress_bar=False,
                    default_root_dir=tempfile.mkdtemp())
trainer.fit(Regression(), torch.utils.data.DataLoader(data, batch_size=8))
fabric = L.Fabric(accelerator="cpu", devices=2, strategy="ddp")
fabric.launch()
for step in range(4):
    fabric.log("fabric_loss", 1.0 / (step + 1), step=step)
print("world sizes", trainer.world_size, fabric.world_size)
"""

OFF = """
%%distributed -n 2 --metrics off
from accelerate import Accelerator
accelerator = Accelerator()
accelerator.log({"captured": 1.0}, step=1)
log_metrics(step=1, explicit=2.0)
"""

# WandB offline through Accelerate's tracker: WANDB_MODE=offline never opens a connection; the run is a local
# directory under WANDB_DIR, written by the wandb-core service that rank 0's wandb.init starts
WANDB_SETUP = """
wandb_dir = os.path.join(os.getcwd(), "wandb_runs")
os.makedirs(wandb_dir)
os.environ.update(WANDB_MODE="offline", WANDB_SILENT="true", WANDB_DIR=wandb_dir)
print("wandb dir", wandb_dir)
"""

WANDB_TRACKER = """
%%distributed -n 2
from accelerate import Accelerator
accelerator = Accelerator(log_with="wandb")
accelerator.init_trackers("nblaunch-test")
for step in range(6):
    accelerator.log({"wb_loss": 1.0 - 0.125 * step}, step=step)
accelerator.end_training()
"""

# any process started with this WANDB_DIR (wandb-core is exec'd with it; an orphan is no longer the kernel's descendant)
WANDB_LEFT = """
summary('wandb')
import psutil
def _started_with_wandb_dir(p):
    try:
        return p.environ().get("WANDB_DIR") == wandb_dir
    except (psutil.Error, OSError):
        return False
print("wandb left", [p.pid for p in psutil.process_iter() if p.pid != os.getpid() and _started_with_wandb_dir(p)])
print("kernel children", [p.name() for p in psutil.Process().children(recursive=True)])
"""

CELLS = [
    SETUP,
    ACCELERATE,
    "summary('accelerate')",
    ACCELERATE_TRACKER,
    "summary('tracker'); print('tracker files', bool(os.listdir(os.path.join(tb_dir, 'acc'))))\n"
    "from tensorboard.backend.event_processing.event_accumulator import EventAccumulator\n"
    "runs = [d for d, _, fs in os.walk(os.path.join(tb_dir, 'acc')) if any(f.startswith('events.') for f in fs)]\n"
    "print('tracker runs', len(runs), [e.step for e in EventAccumulator(runs[0]).Reload().Scalars('acc_loss')])",
    WRITER,
    "summary('writer')\nprint('event files', [bool(os.listdir(os.path.join(tb_dir, f'sw{r}'))) for r in (0, 1)])",
    TRAINER,
    "summary('trainer'); print('trainer tb files', bool(os.listdir(os.path.join(tb_dir, 'hf0'))))\n"
    "print('frame', sorted(last_report().metrics_frame().columns))",
    LIGHTNING,
    "summary('lightning')",
    OFF,
    "summary('off')",
    WANDB_SETUP,
    WANDB_TRACKER,
    WANDB_LEFT,
]


@pytest.fixture(scope="module")
def notebook(starts_kernels, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("capture")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(textwrap.dedent(c).strip()) for c in CELLS]
    NotebookClient(
        nb, timeout=300, kernel_name="python3", store_widget_state=True, resources={"metadata": {"path": str(tmp)}}
    ).execute()
    path = tmp / "executed.ipynb"
    nbformat.write(nb, path)
    return nbformat.read(path, 4)  # what a user reopening the saved notebook gets


def _text(nb, i: int) -> str:
    return "".join(o.get("text", "") for o in nb.cells[i].outputs if o.output_type == "stream")


def _history(nb, i: int, label: str) -> list[dict]:
    line = next(ln for ln in _text(nb, i).splitlines() if ln.startswith(label + " "))
    return ast.literal_eval(line[len(label) + 1 :])


def _chart(nb, i: int) -> str:
    """The final chart of cell i, from the widget state stored in the notebook."""
    state = nb.metadata.widgets["application/vnd.jupyter.widget-state+json"]["state"]
    root = next(o for o in nb.cells[i].outputs if o.output_type == "display_data")
    box = state[root.data["application/vnd.jupyter.widget-view+json"]["model_id"]]["state"]
    status, bars, chart = (c.removeprefix("IPY_MODEL_") for c in box["children"])
    return state[chart]["state"]["value"]


def test_the_libraries_under_test_were_not_imported_in_the_kernel_before_the_ranks_needed_them(notebook):
    # so Trainer and Lightning are patched as the rank imports them, SummaryWriter as inherited from the kernel
    assert "kernel imported []" in _text(notebook, 0)


def test_accelerate_log_without_trackers_draws_the_chart_and_keeps_the_history(notebook):
    history = _history(notebook, 2, "accelerate")
    assert [p["step"] for p in history] == list(range(1, 41))
    assert history[-1] == {"step": 40, "loss": 1.0 / 40**2, "lr": pytest.approx(1e-3)}  # text left out
    chart = _chart(notebook, 1)
    assert chart.startswith('<div class="nblaunch-chart"') and "loss: last 0.000625 (40 points) (log scale)" in chart
    assert "lr: last 0.001 (40 points)" in chart


def test_accelerate_tracker_still_writes_and_each_point_is_recorded_once(notebook):
    assert _history(notebook, 4, "tracker") == [{"step": s, "acc_loss": 2.0 - 0.25 * s} for s in range(5)]
    assert "tracker files True" in _text(notebook, 4)
    # one run directory (rank 0's tracker), every step in its event file once: nothing written twice
    assert "tracker runs 1 [0, 1, 2, 3, 4]" in _text(notebook, 4)


def test_summary_writer_add_scalar_draws_the_chart_and_still_writes_event_files(notebook):
    history = _history(notebook, 6, "writer")
    assert [p for p in history if "train/loss" in p] == [
        {"step": s, "train/loss": pytest.approx(3.0 - 0.2 * s)} for s in range(10)
    ]
    assert {"step": 9, "eval/acc": 0.9, "eval/f1": 0.8} in history
    assert "event files [True, True]" in _text(notebook, 6)  # rank 1's writer works, its points are not charted
    chart = _chart(notebook, 5)
    assert "train/loss: last 1.2 (10 points)" in chart and "eval/acc</b> 0.9" in chart


def test_trainer_logs_at_every_logging_step_reach_the_chart_and_its_callbacks(notebook):
    history = _history(notebook, 8, "trainer")
    steps = [p for p in history if "loss" in p]
    assert [p["step"] for p in steps] == [1, 2, 3, 4]
    assert all({"loss", "learning_rate", "grad_norm", "epoch"} <= set(p) for p in steps)
    assert any("train_runtime" in p for p in history)  # the end-of-training summary too
    out = _text(notebook, 7)
    assert "callback saw 5 ['epoch', 'grad_norm', 'learning_rate', 'loss']" in out
    assert "trainer tb files True" in _text(notebook, 8)
    assert "'grad_norm'" in _text(notebook, 8) and "'step'" in _text(notebook, 8)  # the metrics frame's columns
    chart = _chart(notebook, 7)
    for name in ("loss", "learning_rate", "grad_norm", "epoch"):
        assert f"{name}: last " in chart and "(4 points)" in chart
    assert "train_runtime</b>" in chart  # logged once: a value, not a curve


def test_lightning_self_log_and_fabric_log_draw_the_chart_under_ddp(notebook):
    history = _history(notebook, 10, "lightning")
    assert [p["step"] for p in history if "train_loss" in p] == [0, 1, 2, 3, 4, 5]
    assert [p["fabric_loss"] for p in history if "fabric_loss" in p] == [1.0, 0.5, 1 / 3, 0.25]
    assert not any("hp_metric" in p for p in history)
    assert "world sizes 2 2" in _text(notebook, 9)
    chart = _chart(notebook, 9)
    assert "train_loss: last " in chart and "(6 points)" in chart and "fabric_loss: last 0.25 (4 points)" in chart


def test_metrics_off_leaves_the_frameworks_alone_and_log_metrics_still_draws(notebook):
    assert _history(notebook, 12, "off") == [{"step": 1, "explicit": 2.0}]


def _wandb_records(path: str):
    """The records of a `.wandb` file: a LevelDB-style log (32 KiB blocks, 7-byte chunk headers after a 7-byte
    ':W&B' file header) of wandb's own protobuf `Record`s; wandb 0.31 ships no Python reader for it."""
    from wandb.proto import wandb_internal_pb2

    data = open(path, "rb").read()
    assert data[:4] == b":W&B", f"{path} is not a wandb run file: {data[:7]!r}"
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if left < 7 or (kind == 0 and length == 0):  # block padding
            pos += left
            continue
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST chunk: a record is complete
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def test_wandb_offline_tracker_writes_one_run_with_each_step_once_and_draws_the_chart(notebook):
    assert _history(notebook, 15, "wandb") == [{"step": s, "wb_loss": 1.0 - 0.125 * s} for s in range(6)]
    chart = _chart(notebook, 14)
    assert "wb_loss: last 0.375 (6 points)" in chart
    wandb_dir = next(ln for ln in _text(notebook, 13).splitlines() if ln.startswith("wandb dir ")).split(" ", 2)[2]
    runs = glob.glob(f"{wandb_dir}/wandb/offline-run-*")
    assert len(runs) == 1, runs  # rank 0's tracker only
    (run_file,) = glob.glob(f"{runs[0]}/run-*.wandb")
    records = list(_wandb_records(run_file))
    history = [
        (r.history.step.num, {i.key or "/".join(i.nested_key): i.value_json for i in r.history.item})
        for r in records
        if r.HasField("history")
    ]
    assert [step for step, _ in history] == list(range(6))  # each step once: nothing written twice
    assert [float(items["wb_loss"]) for _, items in history] == [1.0 - 0.125 * s for s in range(6)]
    assert records[-1].HasField("exit")  # end_training() finished the run
    # wandb-core ended with the run: nothing left by the rank's exit
    out = _text(notebook, 15)
    assert "wandb left []" in out
    assert "wandb" not in next(ln for ln in out.splitlines() if ln.startswith("kernel children "))
