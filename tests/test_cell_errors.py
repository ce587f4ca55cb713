"""Errors in the notebook's language, in a real kernel: a rank's traceback names the cell by the count the
notebook shows; ■ during a run is a short KeyboardInterrupt with no nblaunch frame that says nothing is left
running; Stop and --timeout end with the same short form."""

from __future__ import annotations

import re

import pytest
from harness import children

FAILING = "%%distributed -n 2\nx = 1\nraise ValueError('cell count check')\n"
NBLAUNCH_FRAME = re.compile(r"kernelside[/\\]|site-packages[/\\]|selectors\.py")


@pytest.fixture(scope="module")
def kernel(kernel_with):
    return kernel_with("import time")


def _text(cell) -> str:
    return "\n".join(cell.error["traceback"]) if cell.error else ""


def test_a_rank_traceback_names_the_cell_by_the_count_the_notebook_shows(kernel):
    for _ in range(3):
        kernel.run("1 + 1").ok()  # counts move on, as in a notebook that ran other cells first
    for _ in range(2):
        cell = kernel.run(FAILING)
        count = cell.reply["execution_count"]
        assert f'File "<%%distributed cell In[{count}]>", line 3' in _text(cell), _text(cell)


def test_a_live_cell_traceback_names_the_cell_by_its_count_too(kernel):
    kernel.run("%distributed_start -n 2").ok()
    try:
        kernel.run("y = 2").ok()
        cell = kernel.run(FAILING)
        count = cell.reply["execution_count"]
        assert f"<%%distributed cell In[{count}]>" in _text(cell), _text(cell)
        # the same text again: each rank compiled it once, and the code names the cell it runs in now
        nested = "%%distributed\ndef f():\n    return [1 / 0 for _ in range(1)]\nf()\n"
        first, again = kernel.run(nested), kernel.run(nested)
        for c in (first, again):
            n = c.reply["execution_count"]
            assert f'File "<%%distributed cell In[{n}]>", line 3, in <listcomp>' in _text(c), _text(c)
            assert "return [1 / 0 for _ in range(1)]" in _text(c), _text(c)
    finally:
        kernel.run("%distributed_stop").ok()


def _interrupt_when(kernel, marker: str):
    sent = {}

    def on_output(kind, content):
        if marker in content.get("text", "") and not sent:
            sent["yes"] = True
            kernel.interrupt()

    return on_output


def test_an_interrupt_is_a_short_keyboardinterrupt_without_nblaunch_frames_naming_where_each_rank_was(kernel, tmp_path):
    before = children(kernel.pid)
    asleep = str(tmp_path / "rank1-asleep")  # rank 0 says "waiting" only once rank 1 is in its sleep (line 4)
    body = (
        "%%distributed -n 2\nimport os, time, torch.distributed as dist\nif rank == 1:\n"
        f"    open({asleep!r}, 'w').close(); time.sleep(60)\n"
        f"while not os.path.exists({asleep!r}): time.sleep(0.01)\nprint('waiting', flush=True)\ndist.barrier()\n"
    )
    cell = kernel.run(body, timeout=60, on_output=_interrupt_when(kernel, "waiting"))
    assert cell.error["ename"] == "KeyboardInterrupt"
    text, count = _text(cell), cell.reply["execution_count"]
    assert "interrupted" in cell.error["evalue"] and "nothing is left running" in cell.error["evalue"]
    assert f"rank 0: cell In[{count}], line 7 in <module>, waiting in torch.distributed.barrier()" in text, text
    assert f"rank 1: cell In[{count}], line 4 in <module>" in text, text
    assert not NBLAUNCH_FRAME.search(text), text
    assert len(text.splitlines()) <= 6, text
    assert children(kernel.pid) <= before


def test_a_timeout_is_the_same_short_form_and_names_where_each_rank_was(kernel):
    # (4 s: both ranks reach their sleep before it, with two busy processes beside the suite)
    cell = kernel.run("%%distributed -n 2 --timeout 4\ntime.sleep(60)\n", timeout=60)
    assert cell.error["ename"] == "LaunchTimeoutError"
    text, count = _text(cell), cell.reply["execution_count"]
    assert not NBLAUNCH_FRAME.search(text), text
    assert "nothing is left running" in text
    assert f"rank 1: cell In[{count}], line 2 in <module>" in text, text
