"""%%distributed, %distributed_config and %distributed_last in a real ipykernel."""

from __future__ import annotations

import textwrap

import pytest
from kernel import run_terminal_ipython

NET = """
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)
    def forward(self, x):
        return self.lin(x)
data = torch.randn(64, 4), torch.randn(64, 1)
"""


@pytest.fixture(scope="module")
def kernel(kernel_with):
    return kernel_with(NET)


def test_cell_trains_ddp_and_returns_the_plain_model_and_losses(kernel):
    cell = kernel.run("""%%distributed -n 2 --return model,losses
torch.manual_seed(0)
model = DDP(Net())
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = data[0][rank::world_size], data[1][rank::world_size]
losses = []
for step in range(5):
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
    losses.append(loss.item())
print(f"rank {rank}/{world_size} done on {device}")
losses[-1]
""").ok()
    assert cell.stdout == "rank 0/2 done on cpu\n"
    check = kernel.run(
        "print(type(model).__name__, isinstance(model, Net), len(losses), float(cell_result) == losses[-1])".replace(
            "cell_result", "_"
        )
    ).ok()
    assert check.stdout.split() == ["Net", "True", "5", "True"]
    assert float(cell.result["text/plain"]) > 0


def test_last_expression_renders_richly_and_semicolon_suppresses_it(kernel):
    cell = kernel.run(
        "%%distributed -n 2\nimport pandas as pd\npd.DataFrame({'rank': [rank], 'world': [world_size]})\n"
    )
    cell.ok()
    assert "<table" in cell.result["text/html"]
    quiet = kernel.run("%%distributed -n 2\nrank + 100;  # no output\n").ok()
    assert quiet.result is None


def test_failing_rank_shows_its_traceback_with_cell_line_numbers(kernel):
    cell = kernel.run("""%%distributed -n 2
import torch.distributed as dist
value = 1
if rank == 1:
    raise ValueError("broken shard")
dist.barrier()
""")
    err = cell.error
    assert err["ename"] == "WorkerError"
    text = "\n".join(err["traceback"])
    assert "rank 1 failed: ValueError: broken shard" in text
    assert 'line 5, in <module>\n    raise ValueError("broken shard")' in text
    assert "kernelside" not in text.split("--- rank 1 traceback ---")[1].split("stopped")[0]


def test_return_from_all_gives_a_list_per_name_indexed_by_rank(kernel):
    kernel.run("%%distributed -n 3 --return shard --return-from all\nshard = rank * 10\n").ok()
    assert kernel.run("print(shard)").ok().stdout.strip() == "[0, 10, 20]"


def test_return_of_an_undefined_name_lists_what_exists(kernel):
    cell = kernel.run("%%distributed -n 2 --return modle\nmodel_ok = 1\n")
    assert cell.error["ename"] == "LaunchConfigError"
    assert "rank 0 did not define 'modle'" in cell.error["evalue"]
    assert "model_ok" in cell.error["evalue"]


@pytest.mark.parametrize(
    "line, fragment",
    [
        ("%%distributed --num-procs 2", "unrecognized arguments: --num-procs"),
        ("%%distributed -n 0", "invalid num_processes=0"),
        ("%%distributed --mixed-precision fp9", "invalid mixed_precision='fp9'"),
        ("%%distributed --return-from 5 -n 2", "--return-from"),
    ],
)
def test_bad_flags_are_clear_errors_and_nothing_runs(kernel, line, fragment, tmp_path):
    marker = tmp_path / "ran"
    cell = kernel.run(f"{line}\nopen({str(marker)!r}, 'w').close()\n")
    assert cell.reply["status"] == "error"
    # IPython shows a UsageError (bad flag syntax) on stderr, other errors as the cell's error
    shown = cell.stderr + (cell.error["evalue"] + "".join(cell.error["traceback"]) if cell.error else "")
    assert fragment in shown
    assert not marker.exists()


@pytest.mark.parametrize(
    "body, fragment",
    [
        ("return 5", "'return' at the top level"),
        ("import asyncio\nawait asyncio.sleep(0)", "top-level 'await'"),
        ("!ls", "IPython magics and ! commands cannot run"),
    ],
)
def test_cell_code_that_cannot_run_in_a_worker_is_refused_up_front(kernel, body, fragment):
    cell = kernel.run(f"%%distributed -n 2\n{body}\n")
    assert cell.error["ename"] == "LaunchConfigError"
    assert fragment in cell.error["evalue"]


def test_spawn_ships_notebook_classes_and_names_what_cannot_be_sent(kernel):
    cell = kernel.run("%%distributed -n 2 --start-method spawn --return w\nw = Net().lin.weight.shape[1] + rank\n")
    cell.ok()
    assert kernel.run("print(w)").ok().stdout.strip() == "4"
    kernel.run("import threading\nlock = threading.Lock()").ok()
    bad = kernel.run("%%distributed -n 2 --start-method spawn\nwith lock:\n    pass\n")
    assert bad.error["ename"] == "LaunchConfigError"
    assert "'lock' (lock)" in bad.error["evalue"] and "--start-method fork" in bad.error["evalue"]


def test_distributed_config_says_where_each_value_comes_from(tmp_path, new_kernel):
    (tmp_path / "nblaunch.yaml").write_text("num_processes: 3\nmixed_precision: bf16\n")
    k = new_kernel(cwd=str(tmp_path))
    out = k.run("%distributed_config").ok().stdout
    cfg_path = str(tmp_path / "nblaunch.yaml")
    assert f"config file: {cfg_path}" in out
    assert [ln for ln in out.splitlines() if ln.strip().startswith("num_processes")][0].endswith(cfg_path)
    assert "'rank0'" in out and "from default" in out
    assert "plan: 3 processes, backend gloo" in out
    assert "start method: fork (fork is safe: CUDA is not initialized in this kernel)" in out
    run = k.run("%%distributed\nprint(world_size)\n").ok()  # the config file applies in a non-repo cwd
    assert run.stdout.strip() == "3"
    last = k.run("%distributed_last").ok().result
    assert "exit code 0" in last["text/plain"] and "| 2 |" in last["text/markdown"]


@pytest.mark.processes
def test_magic_works_in_plain_terminal_ipython(tmp_path):
    script = tmp_path / "run.ipy"
    # a terminal IPython shell runs the file; each run_cell is one cell, as typed at the prompt
    script.write_text(
        textwrap.dedent('''\
        %load_ext kernelside
        get_ipython().run_cell("""%%distributed -n 2 --return total
        import torch, torch.distributed as dist
        t = torch.tensor([rank + 1.0]); dist.all_reduce(t)
        total = t.item()
        print("terminal rank", rank)
        """)
        print('total', total, type(get_ipython()).__name__)
        ''')
    )
    proc = run_terminal_ipython(script)
    assert proc.returncode == 0, proc.stderr
    assert "terminal rank 0" in proc.stdout and "terminal rank 1" not in proc.stdout
    assert "total 3.0 TerminalInteractiveShell" in proc.stdout


def test_the_api_the_magic_calls_runs_a_cell_from_code_with_the_same_result(kernel):
    cell = kernel.run(
        "from kernelside.notebook.cell_targets import CellRequest, cell_target\n"
        "scale = 5\n"
        "result = cell_target({'num_processes': 2}).run(\n"
        "    CellRequest('x = (rank + 1) * scale\\nx * 10', return_names=('x',), return_from='all'), globals())\n"
        "print(type(result).__name__, result.value, result.names, result.ranks)\n"
    ).ok()
    assert "CellResult 50 {'x': [5, 10]} (0, 1)" in cell.stdout
