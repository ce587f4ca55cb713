"""Rank 0's display(), update_display(), clear_output() and plt.show() reach the cell as rich output,
in order with its text, within the output budget; transformers' notebook callback draws its table."""

from __future__ import annotations

import base64
import subprocess
import sys

import pytest
from kernel import REPO


@pytest.fixture(scope="module")
def kernel(kernel_with, tmp_path_factory):
    # as a notebook would: IPython's display names imported in a cell before the launch
    return kernel_with(
        "from IPython.display import display, update_display, clear_output, HTML",
        cwd=tmp_path_factory.mktemp("display"),
    )


def _rank_outputs(cell):
    """The cell's outputs without nblaunch's own run display (a widget)."""
    return [
        (kind, c)
        for kind, c in cell.outputs
        if not (kind == "display_data" and "application/vnd.jupyter.widget-view+json" in c["data"])
    ]


def test_display_html_markdown_json_and_a_figure_arrive_as_rich_outputs_in_order_with_text(kernel):
    cell = kernel.run("""%%distributed -n 2
from IPython.display import Markdown, JSON
import matplotlib.pyplot as plt
print("before", rank)
display(HTML(f"<b>html from rank {rank}</b>"))
print("between", end="")
display(Markdown("*md*"), JSON({"answer": 42}))
plt.plot([1, 2, 3])
plt.show()
print("after")
""").ok()
    outs = _rank_outputs(cell)
    kinds = [(k, c.get("text") or sorted(m for m in c.get("data", {}) if m != "text/plain")) for k, c in outs]
    assert kinds == [
        ("stream", "before 0\n"),
        ("display_data", ["text/html"]),
        ("stream", "between"),
        ("display_data", ["text/markdown"]),
        ("display_data", ["application/json"]),
        ("display_data", ["image/png"]),
        ("stream", "after\n"),
    ]
    assert outs[1][1]["data"]["text/html"] == "<b>html from rank 0</b>"
    assert outs[4][1]["data"]["application/json"] == {"answer": 42}
    assert base64.b64decode(outs[5][1]["data"]["image/png"])[:8] == b"\x89PNG\r\n\x1a\n"
    assert "html from rank 1" not in str(cell.outputs)  # rank 1's displays stay in its own log


def test_c_level_output_written_before_a_display_lands_before_it(kernel):
    # bytes written past Python's streams (os.write on fd 1, C's printf) go through the same pipe as the
    # mark the display is sent after, so the rank's reader puts them in order exactly
    cell = kernel.run("""%%distributed -n 2
import ctypes, os
libc = ctypes.CDLL(None)
for i in range(40):
    os.write(1, f"fd write {i}\\n".encode())
    libc.printf(f"printf {i}\\n".encode())
    display(HTML(f"<b>shown {i}</b>"))
_ = os.write(1, b"fd write end\\n")
""").ok()
    outs = _rank_outputs(cell)
    seen = []
    for kind, c in outs:
        if kind == "stream":
            seen += [line for line in c["text"].splitlines() if line]
        else:
            seen.append(c["data"].get("text/html", c["data"]))
    expected = [x for i in range(40) for x in (f"fd write {i}", f"printf {i}", f"<b>shown {i}</b>")]
    assert seen == expected + ["fd write end"]


def test_prints_and_displays_in_a_tight_loop_keep_their_order(kernel):
    cell = kernel.run("""%%distributed -n 2
if rank == 0:
    for i in range(40):
        print(f"line {i}")
        display(HTML(f"<i>{i}</i>"))
""").ok()
    seq = []
    for kind, c in _rank_outputs(cell):
        if kind == "stream":
            seq += [ln for ln in c["text"].splitlines() if ln]
        else:
            seq.append(c["data"]["text/html"])
    assert seq == [x for i in range(40) for x in (f"line {i}", f"<i>{i}</i>")]


def test_update_display_and_clear_output_reach_the_cell(kernel):
    cell = kernel.run("""%%distributed -n 2
if rank == 0:
    h = display(HTML("step 0"), display_id=True)
    for step in range(1, 4):
        h.update(HTML(f"step {step}"))
    update_display(HTML("done"), display_id=h.display_id)
    clear_output(wait=True)
    print("cleared")
""").ok()
    msgs = [(k, c) for k, c in cell.messages if k in ("display_data", "update_display_data", "clear_output")]
    msgs = [(k, c) for k, c in msgs if "application/vnd.jupyter.widget-view+json" not in c.get("data", {})]
    first_id = msgs[0][1]["transient"]["display_id"]
    assert [(k, c.get("data", {}).get("text/html")) for k, c in msgs] == [
        ("display_data", "step 0"),
        ("update_display_data", "step 1"),
        ("update_display_data", "step 2"),
        ("update_display_data", "step 3"),
        ("update_display_data", "done"),
        ("clear_output", None),
    ]
    assert all(c["transient"]["display_id"] == first_id for _, c in msgs[1:5])
    assert msgs[-1][1]["wait"] is True


def test_spawned_rank_displays_richly_too(kernel):
    cell = kernel.run("""%%distributed -n 2 --start-method spawn
from IPython.display import display, HTML
display(HTML(f"<b>spawned {rank}</b>"))
""").ok()
    html = [c["data"].get("text/html") for k, c in _rank_outputs(cell) if k == "display_data"]
    assert html == ["<b>spawned 0</b>"]


def test_rich_output_over_the_budget_is_left_out_and_counted(kernel):
    cell = kernel.run("""%%distributed -n 2
if rank == 0:
    big = "x" * (300 * 1024)
    for i in range(6):
        display(HTML(f"<pre>{i}{big}</pre>"))
""").ok()
    shown = [c for k, c in _rank_outputs(cell) if k == "display_data"]
    # a 1 MiB burst: three 300 KiB bundles fit, the rest of the burst is spent before the refill catches up
    assert 3 <= len(shown) < 6
    assert f"[nblaunch: {6 - len(shown)} rich output(s) of rank 0 (display(), figures) not shown here" in cell.stdout


def test_transformers_notebook_callback_draws_its_live_table_in_the_cell(kernel, tmp_path):
    kernel.run("from transformers import Trainer, TrainingArguments").ok()  # the notebook picks its callback
    cell = kernel.run(
        f"""%%distributed -n 2
import torch
from transformers import BertConfig, BertForSequenceClassification
cfg = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                 intermediate_size=32, max_position_embeddings=16)
g = torch.Generator().manual_seed(0)
data = [{{"input_ids": torch.randint(0, 64, (8,), generator=g), "labels": torch.tensor(i % 2)}} for i in range(32)]
args = TrainingArguments(output_dir={str(tmp_path)!r}, max_steps=6, per_device_train_batch_size=4, logging_steps=2,
                         report_to="none", save_strategy="no", use_cpu=True)
trainer = Trainer(model=BertForSequenceClassification(cfg), args=args, train_dataset=data)
print("callback", type(trainer.callback_handler.callbacks[-1]).__name__)
trainer.train()
print("trained on", trainer.args.world_size, "ranks")
""",
        timeout=300,
    ).ok()
    assert "<IPython.core.display.HTML object>" not in cell.stdout
    assert "callback NotebookProgressCallback" in cell.stdout and "trained on 2 ranks" in cell.stdout
    rich = [
        (k, c)
        for k, c in cell.messages
        if k in ("display_data", "update_display_data") and "text/html" in c.get("data", {})
    ]
    first, last = rich[0], rich[-1]
    assert first[0] == "display_data" and "<progress" in first[1]["data"]["text/html"]
    assert last[0] == "update_display_data"
    assert last[1]["transient"]["display_id"] == first[1]["transient"]["display_id"]
    assert "[6/6" in last[1]["data"]["text/html"] and "Training Loss" in last[1]["data"]["text/html"]


def test_updates_over_the_budget_are_coalesced_and_the_newest_lands(kernel):
    cell = kernel.run("""%%distributed -n 2
if rank == 0:
    h = display(HTML("v0"), display_id=True)
    pad = "x" * (450 * 1024)
    for v in range(1, 5):
        h.update(HTML(f"v{v}<!--{pad}-->"))
""").ok()
    msgs = [(k, c) for k, c in cell.messages if k in ("display_data", "update_display_data")]
    msgs = [(k, c["data"]["text/html"][:2]) for k, c in msgs if "text/html" in c["data"]]
    assert msgs[0] == ("display_data", "v0")
    assert msgs[-1] == ("update_display_data", "v4")  # 1.8 MiB of updates in a 1 MiB burst: the last one lands
    assert "not shown here" not in cell.stdout


@pytest.mark.processes
def test_a_rank_that_imports_ipython_after_start_up_still_sends_rich_output():
    # a spawned rank in text mode has not imported IPython when nblaunch sets it up: the display
    # functions are replaced when the rank's code first imports them
    code = """
import os, sys
from kernelside.worker import rank_display
from kernelside.channel import EventReader, EventWriter
r, w = os.pipe()
rank_display.install(EventWriter(w), rank=0)
assert "IPython.core.display_functions" not in sys.modules
from IPython.display import HTML, display
display(HTML("<b>imported late</b>"))
os.close(w)
events = list(EventReader().feed(os.read(r, 1 << 20)))
print(events[0][0], events[0][1]["op"], events[0][1]["data"]["text/html"])
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "display display <b>imported late</b>\n"
