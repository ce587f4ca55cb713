"""Which notebook names a cell needs and how they are packed (kernelside/launch/payload.py), and the
live transport's cache (kernelside/live/names.py): no kernel, no ranks needed to decide either."""

from __future__ import annotations

import pickle
import threading

import cloudpickle
import numpy as np
import pytest

from kernelside.errors import LaunchConfigError
from kernelside.launch.payload import NOT_CAPTURED, Payload, cell_free_names, cell_needs, function_needs
from kernelside.live import names as live_names
from kernelside.live.names import NameSender
from kernelside.notebook.cell import prepare_cell


def _notebook(source: str) -> dict:
    """A namespace whose functions are the notebook's own (``__module__ == "__main__"``)."""
    ns = {"__name__": "__main__"}
    exec(compile(source, "<notebook>", "exec"), ns)
    return ns


def test_a_cell_needs_the_names_it_reads_and_those_of_the_notebook_functions_it_calls():
    ns = _notebook("lr = 0.1\nscale = 3\nunused = 1\ndef step(x):\n    return x * scale\n")
    ns.update(In=[], Out={}, _=5, rank=7)
    assert cell_needs("y = step(lr) + _ + rank\nprint(In)", ns) == {"lr", "scale", "step"}


def test_ipython_names_are_skipped_by_every_path_alike():
    ns = _notebook("def f():\n    return Out, get_ipython, x\nx = 1\n")
    ns.update({n: object() for n in NOT_CAPTURED})
    assert function_needs(ns["f"], ns) == {"x"}
    assert cell_needs("f(); In; Out; exit", ns) == {"f", "x"}
    assert "Out" in cell_free_names("print(Out)")  # export's analysis names it; its collector then skips it


def test_a_spawn_payload_carries_only_the_names_the_cell_reads():
    program = prepare_cell("y = lr * 2\ny", cell_label="In[1]")
    ns = {"lr": 0.5, "big": bytes(10**6), "In": []}
    fn, args, kwargs = cloudpickle.loads(Payload(program, namespace=ns).pickled())
    assert fn.namespace == {"lr": 0.5} and (args, kwargs) == ((), {})
    assert program.namespace is None  # the request's program is never changed by packing it


def test_a_fork_payload_runs_in_the_notebook_namespace_itself():
    program = prepare_cell("y = 1", cell_label="In[1]")
    ns = {"lr": 0.5}
    assert Payload(program, namespace=ns).callable_for("fork").namespace is ns


def test_an_unpicklable_notebook_name_is_named_before_anything_starts():
    program = prepare_cell("lock.acquire()", cell_label="In[2]")
    with pytest.raises(LaunchConfigError, match="names cannot be sent to spawned workers: 'lock' \\(lock\\)"):
        Payload(program, namespace={"lock": threading.Lock()}).pickled()


def test_an_unpicklable_argument_is_named_by_its_parameter():
    def train(cfg):
        return cfg

    with pytest.raises(LaunchConfigError, match="argument 'cfg'"):
        Payload(train, (threading.Lock(),), describe_args=("argument 'cfg' (args[0])",)).pickled()


@pytest.fixture
def pickle_count(monkeypatch):
    """Counts the live transport's pickling (the real ``dumps`` still runs)."""
    calls = []
    real = live_names.dumps

    def counting(value):
        calls.append(type(value).__name__)
        return real(value)

    monkeypatch.setattr(live_names, "dumps", counting)
    return calls


def test_an_unchanged_numpy_array_is_pickled_once_across_cells(pickle_count):
    ns = {"weights": np.arange(1_000_000, dtype=np.float32), "lr": 0.1, "name": "run-1"}
    sender = NameSender()
    first = sender.collect({"weights", "lr", "name"}, ns)
    sender.sent(first)
    assert sorted(first) == ["lr", "name", "weights"]
    for _ in range(5):  # five more cells that use the same unchanged values
        assert sender.collect({"weights", "lr", "name"}, ns) == {}
    assert pickle_count.count("ndarray") == 1
    assert len(pickle_count) == 3  # each value pickled once, when it was sent


def test_an_array_changed_in_place_is_sent_again(pickle_count):
    ns = {"weights": np.zeros(1000)}
    sender = NameSender()
    sender.sent(sender.collect({"weights"}, ns))
    ns["weights"][3] = 1.0
    again = sender.collect({"weights"}, ns)
    assert list(again) == ["weights"]
    assert pickle.loads(again["weights"][0])[3] == 1.0


def test_a_new_value_under_the_same_name_is_sent_even_when_equal_looking():
    ns = {"x": 0.0}
    sender = NameSender()
    sender.sent(sender.collect({"x"}, ns))
    ns["x"] = -0.0
    assert list(sender.collect({"x"}, ns)) == ["x"]
    ns["x"] = [1, 2]  # other objects: a digest of their pickle tells a change
    sender.sent(sender.collect({"x"}, ns))
    ns["x"].append(3)
    assert list(sender.collect({"x"}, ns)) == ["x"]
