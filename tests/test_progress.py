"""progress(), tqdm and log_metrics() inside workers: widgets drawn by the kernel, text elsewhere."""

from __future__ import annotations

import textwrap

import nbformat
import pytest
from kernel import run_terminal_ipython
from nbclient import NotebookClient

from kernelside import last_report, log_metrics, notebook_launcher, progress


def _run_notebook(tmp_path, cells: list[str]) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    NotebookClient(
        nb, timeout=300, kernel_name="python3", store_widget_state=True, resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    return nb


def _widgets(nb) -> dict:
    return nb.metadata.widgets["application/vnd.jupyter.widget-state+json"]["state"]


def _bars(state: dict) -> list[dict]:
    return [m["state"] for m in state.values() if m["model_name"] == "FloatProgressModel"]


def _shown(state: dict, model_id: str) -> list[str]:
    """Every model id reachable from a box, i.e. what the cell still displays."""
    out, todo = [], [model_id]
    while todo:
        mid = todo.pop()
        out.append(mid)
        for child in state[mid]["state"].get("children", []):
            todo.append(child.removeprefix("IPY_MODEL_"))
    return out


# A failing launch inside a try, so the notebook runs on and its widgets can be inspected.
FAILING_CELL = """try:
    get_ipython().run_cell_magic("distributed", "-n 2", '''
for _ in progress(range(5), desc="doomed"):
    if rank == 0:
        raise ValueError("bad shard")
''')
except Exception as e:
    print(type(e).__name__)
"""


# 30 inner bars in a row must not leave 30 sets of widget models behind in the kernel
WIDGET_COUNT_CELL = """from ipywidgets.widgets.widget import _instances
before = len(_instances)
get_ipython().run_cell_magic("distributed", "-n 2", '''
for epoch in progress(range(30), desc="outer"):
    for _ in progress(range(5), desc="inner", leave=False):
        pass
''')
print("widgets added", len(_instances) - before)
"""


@pytest.fixture(scope="module")
def executed(starts_kernels, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("progress")
    return _run_notebook(
        tmp,
        [
            # accelerate's tqdm wrapper binds tqdm.auto's class at import, here in the kernel, before the fork
            "%load_ext kernelside\n"
            "from kernelside import progress, log_metrics\n"
            "from accelerate.utils import tqdm as acc_tqdm",
            textwrap.dedent("""\
            %%distributed -n 2
            from tqdm.auto import tqdm
            step = 0
            for epoch in progress(range(3), desc="epoch"):
                for i in progress(range(40), desc="batches", leave=False):
                    step += 1
                    log_metrics(step=step, loss=1.0 / step)
            for _ in tqdm(range(25), desc="via tqdm.auto"):
                pass
            for _ in acc_tqdm(range(12), desc="via accelerate"):
                pass
            with progress(total=10, desc="manual", unit="img") as bar:
                for _ in range(5):
                    bar.update(2)
                    bar.set_postfix(loss=0.5)
            """),
            "r = __import__('kernelside').last_report()\n"
            "print(len(r.metrics), r.metrics[-1], r.event_counts['progress'])",
            "%%distributed -n 2 --progress all\nfor _ in progress(range(7), desc='per-rank'):\n    pass",
            FAILING_CELL,
            WIDGET_COUNT_CELL,
        ],
    )


def test_rank0_bars_end_exact_and_nested_leave_false_bars_are_removed(executed):
    state = _widgets(executed)
    bars = _bars(state)
    by_desc = {}
    for b in bars:
        by_desc.setdefault(b["description"], []).append(b)
    assert len(by_desc["epoch"]) == 1  # rank 0 only, not one per rank
    assert by_desc["epoch"][0]["value"] == by_desc["epoch"][0]["max"] == 3.0
    assert by_desc["epoch"][0]["bar_style"] == "success"
    # the three leave=False bars shared one widget, closed at the end: no models pile up
    assert "batches" not in by_desc
    assert by_desc["manual"][0]["value"] == 10.0
    # the cell's box still shows epoch, tqdm.auto and manual, but no batches bar (leave=False)
    cell_out = executed.cells[1].outputs
    root = [o for o in cell_out if o.output_type == "display_data"][0]
    shown = _shown(state, root.data["application/vnd.jupyter.widget-view+json"]["model_id"])
    shown_descs = sorted(
        state[m]["state"]["description"] for m in shown if state[m]["model_name"] == "FloatProgressModel"
    )
    assert shown_descs == ["epoch", "manual", "via accelerate", "via tqdm.auto"]
    texts = [state[m]["state"]["value"] for m in shown if state[m]["model_name"] == "HTMLModel"]
    assert any("10/10" in t and "loss=0.5" in t for t in texts)
    assert any("2 done" in t for t in texts)  # the status line


def test_progress_all_draws_one_labelled_bar_per_rank(executed):
    bars = sorted(b["description"] for b in _bars(_widgets(executed)) if "per-rank" in b["description"])
    assert bars == ["[rank 0] per-rank", "[rank 1] per-rank"]
    assert all(b["value"] == 7.0 for b in _bars(_widgets(executed)) if "per-rank" in b["description"])


def test_inner_leave_false_bars_reuse_widgets_instead_of_piling_them_up(executed):
    added = int(executed.cells[-1].outputs[-1]["text"].split()[-1])
    # the run's box, status and chart, the outer bar and one reused inner bar, each model with its layout
    # and style: about 25 whatever the number of inner bars (30 separate inner bars would add 240 more)
    assert added < 40, added


def test_status_line_turns_into_the_error_summary_on_failure(executed):
    assert executed.cells[-2].outputs[-1]["text"] == "WorkerError\n"
    texts = [m["state"]["value"] for m in _widgets(executed).values() if m["model_name"] == "HTMLModel"]
    summary = [t for t in texts if "nblaunch: failed" in t]
    assert summary and "rank 0 failed: ValueError: bad shard" in summary[0] and "logs:" in summary[0]
    doomed = [b for b in _bars(_widgets(executed)) if b["description"] == "doomed"]
    assert doomed and doomed[0]["bar_style"] == "danger"


def test_tqdm_auto_in_a_worker_draws_one_rank0_bar_and_no_text(executed):
    bars = [b for b in _bars(_widgets(executed)) if b["description"] == "via tqdm.auto"]
    assert len(bars) == 1 and bars[0]["value"] == 25.0
    # a library that imported tqdm.auto's class before the launch draws the same bar
    acc = [b for b in _bars(_widgets(executed)) if b["description"] == "via accelerate"]
    assert len(acc) == 1 and acc[0]["value"] == 12.0
    streams = "".join(o.get("text", "") for o in executed.cells[1].outputs if o.output_type == "stream")
    assert "via tqdm.auto" not in streams and "via accelerate" not in streams and "\r" not in streams


def test_metrics_history_is_complete_and_charted(executed):
    out = executed.cells[2].outputs[0]["text"]
    count, rest = out.split(" ", 1)
    assert count == "120" and "'step': 120" in rest
    chart = [
        m["state"]["value"]
        for m in _widgets(executed).values()
        if m["model_name"] == "HTMLModel" and m["state"]["value"].startswith('<div class="nblaunch-chart"')
    ]
    assert chart and "loss: last 0.008333" in chart[-1] and "(120 points)" in chart[-1]


def spin(n):
    for _ in progress(range(n), desc="spin"):
        pass


@pytest.mark.processes
def test_kernel_receives_a_bounded_number_of_progress_messages():
    notebook_launcher(spin_with_widgets, args=(100_000,), num_processes=2)
    rep = last_report()
    seconds = rep.wall_s
    assert 2 <= rep.event_counts["progress"] <= 10 * seconds + 3, (rep.event_counts, seconds)


def spin_with_widgets(n):
    # pytest is no Jupyter kernel, so the engine chose text bars; take the path a kernel would choose
    from kernelside import worker_context

    worker_context().progress_render = "widgets"
    spin(n)


@pytest.mark.processes
def test_text_fallback_in_terminal_ipython_draws_tqdm_text_on_rank0_stderr(tmp_path):
    script = tmp_path / "run.ipy"
    script.write_text(
        textwrap.dedent('''\
        %load_ext kernelside
        get_ipython().run_cell("""%%distributed -n 2
        from kernelside import progress, log_metrics
        for i in progress(range(30), desc=f"text-bar-rank{rank}"):
            log_metrics(step=i, loss=1.0)
        """)
        print("metrics", len(__import__("kernelside").last_report().metrics))
        ''')
    )
    proc = run_terminal_ipython(script)
    assert proc.returncode == 0, proc.stderr
    assert "text-bar-rank0: 100%" in proc.stderr and "30/30" in proc.stderr
    assert "text-bar-rank1" not in proc.stderr + proc.stdout
    assert "metrics 30" in proc.stdout


def test_outside_a_launch_progress_is_tqdm_and_log_metrics_is_a_no_op():
    from tqdm.auto import tqdm

    bar = progress(range(3), disable=True)
    assert isinstance(bar, tqdm)
    assert log_metrics(step=1, loss=2.0) is None
