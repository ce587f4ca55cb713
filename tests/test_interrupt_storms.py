"""■ at any moment, once or five times within a second, under fork, forkserver and spawn.

The matrix: every moment of a one-shot launch (before the ranks exist, while they start, while they import, in a
collective, while results come back) and of a live session (its start, a cell, ``%distributed_stop``) × every start
method × once and as a storm, at fixed offsets from a mark the cell prints (never random ones). Each case asserts
what a user would see or trip over: the cell ends with the short ``KeyboardInterrupt`` (no frame of nblaunch,
ipywidgets, ``threading`` or ``logging`` in what it shows), within ``ENDS_WITHIN_S`` of the first press, with no lock of
the kernel's left held (logging's, the import lock, nblaunch's launch lock), no process left (ranks, children of the
forkserver template), and the next cell works; a live cell's ranks keep their state and their pids.

The figure asserted holds with two busy processes beside the suite (``make test-loaded``); the quiet machine's time
from ■ to the cell's end is ``bench/interrupt.py``'s.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest
from interrupt_storm import aftermath, left_behind, printed, shown, shown_internals, shown_widget, started, storm

from kernelside import interrupts

pytestmark = pytest.mark.kernel

ENDS_WITHIN_S = 6.0  # 2 s on a quiet machine (bench/interrupt.py); this holds beside two busy processes
METHODS = ("fork", "forkserver", "spawn")
PRESSES = {"once": 1, "storm": 5}

SETUP = """
%load_ext kernelside
from kernelside import notebook_launcher
import time, torch, torch.distributed as dist

def quick():
    return 1

def importing():
    print("importing", flush=True)
    import nblaunch_slow_import  # noqa: F401  (SLOW_IMPORT: the rank is inside an import until ■ ends it)
    return 1

def in_collective():
    if dist.get_rank() == 1:
        time.sleep(3)
    print("waiting", flush=True)
    dist.barrier()
    return 1

def returning():
    value = torch.ones(128 * 1024 * 1024 // 4)
    print("returning", flush=True)
    return [value, value.clone(), value.clone()]
"""

# moment -> (the function launched, the mark, seconds after the mark the first ■ comes). Before the ranks exist is
# the first launch of a fresh kernel (its own fixture): the warm-up imports, the forkserver template's start or the
# plan's first imports take a second or more before any rank is started.
ONE_SHOT = {
    "starting": ("quick", shown_widget, 0.0),
    "importing": ("importing", printed("importing"), 0.05),
    "collective": ("in_collective", printed("waiting"), 0.2),
    "results": ("returning", printed("returning"), 0.0),
}


def _runs():
    # fork, the fast one, has every case twice as a storm; every case runs at least once and as a storm
    for method in METHODS:
        for presses in ["storm", "storm", "once"] if method == "fork" else ["storm", "once"]:
            yield method, presses


RUNS = list(_runs())


def _launch(method: str, fn: str = "quick") -> str:
    return f"notebook_launcher({fn}, num_processes=2, start_method='{method}')"


# A module whose import lasts until a file appears that no test makes (60 s at most): whatever the machine's speed,
# a rank that prints "importing" is inside an import (its module lock held, the module half made) when ■ comes.
SLOW_IMPORT = """import os, time
_until = time.monotonic() + 60
while not os.path.exists(os.path.join(os.path.dirname(__file__), "never")) and time.monotonic() < _until:
    time.sleep(0.01)
"""

# A start that lasts whatever the machine's speed: while the flag file is there, a process forked by the kernel (fork)
# or by the forkserver's template (which imports this through sitecustomize, from the PYTHONPATH the kernel gives it)
# sleeps in an at-fork hook, as a library's slow hook would, before it becomes a rank. Without it a fast start (70 ms
# for 2 forked ranks) can be over before the first ■ of a "while they start" case lands, and the case then tests
# ipykernel's handling of a ■ after the cell, not nblaunch's.
SLOW_FORK = """import os, time
FLAG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "slow-forks")
def _slow_fork():
    if os.path.exists(FLAG):
        time.sleep(1.0)
os.register_at_fork(after_in_child=_slow_fork)
"""


@pytest.fixture(scope="module")
def modules(tmp_path_factory):
    path = tmp_path_factory.mktemp("modules")
    (path / "nblaunch_slow_import.py").write_text(SLOW_IMPORT)
    (path / "nblaunch_slow_fork.py").write_text(SLOW_FORK)
    (path / "sitecustomize.py").write_text("import nblaunch_slow_fork  # noqa: F401\n")
    return path


@contextlib.contextmanager
def slow_forks(modules):
    """Every rank forked meanwhile takes a second before it starts (``SLOW_FORK``)."""
    flag = modules / "slow-forks"
    flag.touch()
    try:
        yield
    finally:
        flag.unlink()


@pytest.fixture(scope="module")
def kernel(kernel_with, modules):
    path_setup = (
        f"import os, sys\nsys.path.insert(0, {str(modules)!r})\nimport nblaunch_slow_fork\n"
        f"os.environ['PYTHONPATH'] = os.pathsep.join([{str(modules)!r}, os.environ.get('PYTHONPATH', '')])\n"
    )
    k = kernel_with(path_setup + SETUP, load_ext=False, timeout=120)
    for method in METHODS:  # the first launch of each method starts what later ones reuse (the forkserver template)
        assert k.run(f"print({_launch(method)})").ok().stdout == "1\n"
    return k


def assert_short_interrupt_and_nothing_left(kernel, cell, ended_s):
    assert cell.error is not None and cell.error["ename"] == "KeyboardInterrupt", shown(cell)
    assert shown_internals(cell) == [], shown(cell)
    assert not any(line.lstrip().startswith("File ") for line in cell.error["traceback"]), shown(cell)
    assert ended_s < ENDS_WITHIN_S, (ended_s, shown(cell))
    assert left_behind(kernel) == []
    assert aftermath(kernel) == []


@pytest.mark.parametrize(("method", "presses"), RUNS)
def test_interrupt_before_the_ranks_exist_ends_the_cell_short_and_leaves_nothing(method, presses, new_kernel):
    k = new_kernel(load_ext=False)
    k.run("%load_ext kernelside\nfrom kernelside import notebook_launcher\ndef quick():\n    return 1").ok()
    cell, ended_s = storm(k, _launch(method), at_s=0.2, presses=PRESSES[presses], trigger=started)
    assert_short_interrupt_and_nothing_left(k, cell, ended_s)
    assert k.run(f"print({_launch(method)})", timeout=180).ok().stdout == "1\n"


@pytest.mark.parametrize("moment", list(ONE_SHOT))
@pytest.mark.parametrize(("method", "presses"), RUNS)
def test_interrupt_at_any_moment_of_a_launch_ends_the_cell_short_and_leaves_nothing(
    kernel, modules, moment, method, presses
):
    fn, mark, at_s = ONE_SHOT[moment]
    with slow_forks(modules) if moment == "starting" else contextlib.nullcontext():
        cell, ended_s = storm(kernel, _launch(method, fn), at_s=at_s, presses=PRESSES[presses], trigger=mark)
    assert_short_interrupt_and_nothing_left(kernel, cell, ended_s)
    assert kernel.run(f"print({_launch(method)})").ok().stdout == "1\n"


def _start(kernel, method):
    kernel.run(f"%distributed_start -n 2 --start-method {method}", timeout=120).ok()


def _stop(kernel):
    kernel.run("%distributed_stop", timeout=60).ok()


@pytest.mark.parametrize(("method", "presses"), RUNS)
def test_interrupt_during_a_live_start_ends_the_cell_short_and_the_next_start_works(kernel, modules, method, presses):
    code = f"%distributed_start -n 2 --start-method {method}"
    with slow_forks(modules):
        cell, ended_s = storm(kernel, code, at_s=0.0, presses=PRESSES[presses], trigger=shown_widget)
    assert_short_interrupt_and_nothing_left(kernel, cell, ended_s)
    assert "the live session was not started" in shown(cell)
    _start(kernel, method)
    _stop(kernel)


LIVE_CELL = """%%distributed
if rank == 1:
    time.sleep(3)
print("waiting", flush=True)
dist.barrier()
"""


@pytest.mark.parametrize(("method", "presses"), RUNS)
def test_interrupt_during_a_live_cell_keeps_every_ranks_state_and_process(kernel, method, presses):
    _start(kernel, method)
    try:
        kernel.run("%%distributed\nkept = rank * 10").ok()
        before = kernel.process_counts()[0]
        cell, ended_s = storm(kernel, LIVE_CELL, at_s=0.2, presses=PRESSES[presses], trigger=printed("waiting"))
        assert cell.error is not None and cell.error["ename"] == "KeyboardInterrupt", shown(cell)
        assert "kept its state" in shown(cell) and "restarted" not in shown(cell), shown(cell)
        assert shown_internals(cell) == [], shown(cell)
        assert ended_s < ENDS_WITHIN_S, (ended_s, shown(cell))
        assert aftermath(kernel) == []
        assert kernel.process_counts()[0] == before  # the same rank processes
        kernel.run("%%distributed --return-from all --return kept\nkept").ok()
        assert kernel.run("print(kept)").ok().stdout == "[0, 10]\n"
    finally:
        _stop(kernel)
    assert left_behind(kernel) == []


@pytest.mark.parametrize(("method", "presses"), RUNS)
def test_interrupt_during_distributed_stop_stops_the_session_and_ends_the_cell_short(kernel, method, presses):
    _start(kernel, method)
    # a rank that ignores SIGTERM: the stop waits out its grace (then SIGKILL), and ■ comes 0.3 s into it
    kernel.run("%%distributed\nimport signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)").ok()
    cell, ended_s = storm(kernel, "%distributed_stop", at_s=0.3, presses=PRESSES[presses], trigger=started)
    assert_short_interrupt_and_nothing_left(kernel, cell, ended_s)
    assert "it is stopped, and nothing is left running" in shown(cell)
    _start(kernel, method)
    _stop(kernel)


# -- the gate itself, with real SIGINTs to this process -------------------------------------------------------


def _press():
    os.kill(os.getpid(), signal.SIGINT)


def test_a_press_inside_the_gate_is_counted_and_raised_only_where_checked():
    reached = []
    with pytest.raises(KeyboardInterrupt) as info, interrupts.deferred("stopped before anything started"):
        _press()
        reached.append("after the press")  # the handler did not raise where the press landed
        interrupts.check()
        reached.append("after the check")
    assert reached == ["after the press"]
    assert type(info.value).__name__ == "KeyboardInterrupt" and str(info.value) == "stopped before anything started"


def test_five_presses_within_a_second_are_one_interrupt_and_a_later_press_is_a_new_one():
    gate = interrupts.GATE
    with pytest.raises(KeyboardInterrupt), interrupts.deferred():
        _press()
        with pytest.raises(KeyboardInterrupt):
            interrupts.check()
        presses = gate.presses
        for _ in range(4):
            _press()
        interrupts.check()  # the same ■: no second interrupt
        assert gate.presses_since(presses) == 0
        time.sleep(interrupts.STORM_S)  # (the storm's span itself is what is tested)
        _press()
        assert gate.presses_since(presses) == 1
        interrupts.check()


@pytest.fixture
def python_sigint():
    """Python's own SIGINT handler for the test, whatever the tests before it left (the one it restores after)."""
    left = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, left)


def test_a_press_no_check_saw_is_raised_as_the_block_ends_and_the_handler_is_restored(python_sigint):
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt) as info, interrupts.deferred(as_it_ended="came as it ended"):
        _press()
    assert str(info.value) == "came as it ended"
    # the rest of that storm is dropped for STORM_S, then the handler that was there answers again
    _press()
    time.sleep(interrupts.STORM_S)
    with pytest.raises(KeyboardInterrupt):
        _press()
        time.sleep(0.5)  # (a handler runs between bytecodes: the sleep is where it lands)
    assert signal.getsignal(signal.SIGINT) is before


def test_a_press_during_an_error_never_replaces_the_error():
    with pytest.raises(ValueError), interrupts.deferred():
        _press()
        raise ValueError("the cell's own error")
