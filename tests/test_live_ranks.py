"""Live ranks in a real kernel: state across cells, names from the kernel, failures, interrupts, restarts."""

from __future__ import annotations

import json
import time

import psutil
import pytest
from kernel import Kernel

STATUS = "import json\nfrom kernelside.live.session import current\nprint(json.dumps(current().status()))"


@pytest.fixture(scope="module")
def kernel(kernel_with):
    k = kernel_with("import os, time, signal", "%distributed_start -n 2")
    yield k
    k.run("%distributed_stop")


def _pids(k: Kernel) -> list[int]:
    return [r["pid"] for r in json.loads(k.run(STATUS).ok().stdout)]


def _error_text(cell) -> str:
    return "\n".join(cell.error["traceback"]) if cell.error else ""


def test_names_a_cell_assigns_stay_on_the_ranks_for_later_cells(kernel):
    kernel.run("%%distributed\nstate = {'r': rank, 'n': 0}").ok()
    for _ in range(3):
        kernel.run("%%distributed\nstate['n'] += 1").ok()
    cell = kernel.run("%%distributed --return-from all --return states\nstates = (state['r'], state['n'])").ok()
    assert kernel.run("print(states)").ok().stdout.strip() == "[(0, 3), (1, 3)]"
    assert cell.error is None


def test_a_function_defined_in_the_kernel_after_start_runs_on_the_ranks_with_their_names(kernel):
    kernel.run("%%distributed\nscale = 10 + rank").ok()
    kernel.run("def scaled(x):\n    return x * scale + offset\noffset = 0.5").ok()  # offset: a kernel name
    cell = kernel.run("%%distributed --return-from all --return out\nout = scaled(2)").ok()
    assert cell.error is None
    assert kernel.run("print(out)").ok().stdout.strip() == "[20.5, 22.5]"


def test_ranks_0_runs_only_on_rank_0_and_its_result_is_the_cells(kernel):
    kernel.run("%%distributed\nhits = 0").ok()
    cell = kernel.run("%%distributed --ranks 0\nhits += 1\nprint('on', rank)\nhits").ok()
    assert "on 0" in cell.stdout and cell.result["text/plain"] == "1"
    cell = kernel.run("%%distributed --return-from all --return h\nh = hits").ok()
    assert kernel.run("print(h)").ok().stdout.strip() == "[1, 0]"


def test_a_flag_that_contradicts_the_session_is_an_error_and_nothing_runs(kernel):
    kernel.run("%%distributed\nmarker = 'before'").ok()
    cell = kernel.run("%%distributed -n 8\nmarker = 'after'")
    assert cell.error is not None
    text = _error_text(cell)
    assert "-n 8 contradicts the live session" in text and "num_processes is 2" in text
    assert kernel.run("%%distributed\nmarker").ok().result["text/plain"] == "'before'"


def test_metrics_off_on_a_live_cell_is_refused_saying_how_to_change_it_and_nothing_runs(kernel):
    kernel.run("%%distributed\nmarker = 'before'").ok()
    text = _error_text(kernel.run("%%distributed --metrics off\nmarker = 'after'"))
    assert "--metrics off contradicts the live session (metrics is 'on' there" in text
    assert "metrics: off in nblaunch.yaml" in text and "--output, --progress, --timeout" in text
    assert kernel.run("%%distributed --metrics on\nmarker").ok().result["text/plain"] == "'before'"


def test_a_broken_world_is_restarted_before_the_next_cell_which_says_why(kernel):
    kernel.run("%%distributed\nkept = rank").ok()
    pids = _pids(kernel)
    kernel.run("from kernelside.live.session import current\ncurrent().world.mark_broken('a request was cut')").ok()
    cell = kernel.run("%%distributed\n'kept' in dir()").ok()
    assert "nblaunch: a request was cut; the live session was restarted: its state is gone" in cell.stderr
    assert cell.result["text/plain"] == "False" and set(_pids(kernel)).isdisjoint(pids)


def test_the_status_line_and_last_report_say_live_session_cell_n(kernel):
    kernel.run("%%distributed\ny = 1").ok()
    cell = kernel.run("r = %distributed_last\nprint(r.session, r.outcome)").ok()
    assert cell.stdout.startswith("live session, cell ") and cell.stdout.strip().endswith(" ok")


def test_rank_error_while_peer_waits_in_barrier_returns_within_5s_and_every_rank_keeps_its_state(kernel):
    kernel.run("%%distributed\nkept = f'old state {rank}'").ok()
    pids = _pids(kernel)
    t0 = time.monotonic()
    cell = kernel.run(  # rank 1 fails a second in, while rank 0 waits in the barrier
        "%%distributed\nimport torch.distributed as dist\nif rank == 1:\n"
        "    time.sleep(1); raise ValueError('rank 1 broke')\ndist.barrier()",
        timeout=30,
    )
    elapsed = time.monotonic() - t0
    assert cell.error is not None and cell.error["ename"] == "WorkerError"
    text = _error_text(cell)
    assert elapsed < 8, elapsed  # (1 s of it is rank 1's own sleep; bench.live_recovery times the rest)
    assert "rank 1 failed: ValueError: rank 1 broke" in text and "line 4" in text
    # rank 0 was blocked in gloo's C++ wait: unblocked, back to idle, the group rebuilt in the same processes
    assert "rank 0: cell " in text and "line 5, waiting in torch.distributed.barrier()" in text
    assert "the process group was rebuilt in the same processes: every rank kept its state" in text
    assert "restarted" not in text and _pids(kernel) == pids
    after = kernel.run(
        "%%distributed --return-from all --return k\nk = kept\nimport torch\ndist.all_reduce(torch.ones(1))"
    ).ok()
    assert after.error is None
    assert kernel.run("print(k)").ok().stdout.strip() == "['old state 0', 'old state 1']"


def _kernel_connections(k: Kernel) -> list:
    """The kernel's own established Jupyter connections (its port, the client's port), as the kernel sees them."""
    ports = sorted(v for n, v in k.km.get_connection_info().items() if n.endswith("_port"))
    code = (
        "import psutil\n_c = psutil.Process().net_connections('tcp')\n"
        f"print(sorted((c.laddr.port, c.raddr.port) for c in _c\n"
        f"             if c.status == 'ESTABLISHED' and c.laddr.port in {ports}))"
    )
    return k.run(code).ok().stdout.strip()


def test_a_rank_abort_leaves_the_kernels_jupyter_connections_alone(kernel):
    # forked ranks hold the kernel's own sockets; an abort must shut down only the ranks' process-group ones, or
    # Jupyter's connections are cut and the cell's reply is lost (the cell never ends)
    before = _kernel_connections(kernel)
    cell = kernel.run(
        "%%distributed\nimport torch.distributed as dist\nif rank == 1:\n"
        "    time.sleep(1); raise ValueError('rank 1 broke')\ndist.barrier()",
        timeout=30,
    )
    assert "the process group was rebuilt in the same processes" in _error_text(cell)
    assert _kernel_connections(kernel) == before


def test_rank_error_while_peer_runs_python_keeps_the_peers_state(kernel):
    kernel.run("%%distributed\nkept = f'state of {rank}'").ok()
    cell = kernel.run("%%distributed\nif rank == 1:\n    raise KeyError('only rank 1')\ntime.sleep(30)", timeout=30)
    text = _error_text(cell)
    assert "rank 1 failed: KeyError" in text and "restarted" not in text
    after = kernel.run("%%distributed --return-from all --return k\nk = kept").ok()
    assert after.error is None
    assert kernel.run("print(k)").ok().stdout.strip() == "['state of 0', 'state of 1']"


WAIT_INSIDE_TORCH = """
import sys, threading, torch
def _say_when_inside_torch(main=threading.main_thread().ident):
    while "/torch/" not in sys._current_frames()[main].f_code.co_filename:
        time.sleep(0.01)
    print('waiting', flush=True)
if rank == 0:  # DDP checks its parameters across ranks in C++ (no torch.distributed frame); rank 1 never comes
    threading.Thread(target=_say_when_inside_torch, daemon=True).start()
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))
else:
    time.sleep(60)
"""


def test_interrupt_inside_a_torch_function_that_waits_in_cpp_names_that_function(kernel):
    sent = {}

    def on_output(kind, content):
        if "waiting" in content.get("text", "") and not sent:
            sent["t"] = True
            kernel.interrupt()

    cell = kernel.run("%%distributed" + WAIT_INSIDE_TORCH, timeout=60, on_output=on_output)
    assert cell.error is not None and cell.error["ename"] == "KeyboardInterrupt"
    assert "every rank stopped the cell and kept its state" in _error_text(cell)
    where = cell.stderr
    assert "rank 0: cell " in where and "line 9, inside " in where and "(torch/" in where, where
    assert kernel.run("%%distributed\nprint('next', rank)").ok().stdout == "next 0\n"


def test_interrupt_during_sleep_raises_keyboardinterrupt_within_half_a_second_and_keeps_state(kernel):
    kernel.run("%%distributed\nsurvivor = rank * 100").ok()
    sent = {}

    def on_output(kind, content):
        if "sleeping" in content.get("text", "") and not sent:
            sent["t"] = time.monotonic()
            kernel.interrupt()

    cell = kernel.run("%%distributed\nprint('sleeping', flush=True)\ntime.sleep(60)", timeout=60, on_output=on_output)
    elapsed = time.monotonic() - sent["t"]
    assert cell.error is not None and cell.error["ename"] == "KeyboardInterrupt"
    assert elapsed < 0.5, elapsed
    after = kernel.run("%%distributed --return-from all --return s\ns = survivor").ok()
    assert after.error is None and kernel.run("print(s)").ok().stdout.strip() == "[0, 100]"


def test_interrupt_during_a_collective_keeps_every_ranks_state_and_says_where_each_rank_was(kernel, tmp_path):
    kernel.run("%%distributed\nheld = rank + 7").ok()
    pids = _pids(kernel)
    sent = {}

    def on_output(kind, content):
        if "waiting" in content.get("text", "") and not sent:
            sent["t"] = time.monotonic()
            kernel.interrupt()

    # rank 1 never joins the barrier: rank 0 sits in gloo's C++ wait, where SIGINT cannot reach Python;
    # rank 0 says "waiting" only once rank 1 is in its sleep (line 4), so where each was is known
    asleep = str(tmp_path / "rank1-asleep")
    cell = kernel.run(
        "%%distributed\nimport torch.distributed as dist\nif rank == 1:\n"
        f"    open({asleep!r}, 'w').close(); time.sleep(60)\n"
        f"while not os.path.exists({asleep!r}): time.sleep(0.01)\nprint('waiting', flush=True)\ndist.barrier()",
        timeout=60,
        on_output=on_output,
    )
    elapsed = time.monotonic() - sent["t"]
    assert cell.error is not None and cell.error["ename"] == "KeyboardInterrupt"
    assert elapsed < 5, elapsed
    assert "every rank stopped the cell and kept its state" in _error_text(cell)
    assert "rank 0: cell " in cell.stderr and "line 7, waiting in torch.distributed.barrier()" in cell.stderr
    assert "rank 1: cell " in cell.stderr and "line 4, calling sleep()" in cell.stderr
    assert "restarted" not in cell.stderr and _pids(kernel) == pids
    after = kernel.run(
        "%%distributed --return-from all --return h\nimport torch, torch.distributed as dist\nt = torch.ones(1)\n"
        "dist.all_reduce(t)\nh = (held, t.item())"
    ).ok()
    assert after.error is None and kernel.run("print(h)").ok().stdout.strip() == "[(7, 2.0), (8, 2.0)]"


def test_sigkill_of_a_rank_is_named_and_the_session_restarts(kernel):
    pids = _pids(kernel)
    cell = kernel.run(
        "%%distributed\nif rank == 1:\n    os.kill(os.getpid(), signal.SIGKILL)\ntime.sleep(30)", timeout=30
    )
    text = _error_text(cell)
    assert "rank 1 failed: killed by SIGKILL — out of memory?" in text
    assert "the live session was restarted: its state is gone" in text
    assert kernel.run("%%distributed\nrank").ok().result["text/plain"] == "0"
    assert not any(psutil.pid_exists(p) for p in pids)


@pytest.mark.parametrize(
    "death, named",
    [("import ctypes; ctypes.string_at(0)", "killed by SIGSEGV (segmentation fault)"), ("os._exit(3)", "exit code 3")],
    ids=["segfault", "os_exit"],
)
def test_a_rank_dying_by_segfault_or_os_exit_is_named_the_world_is_up_again_when_the_cell_returns(kernel, death, named):
    kernel.run("%%distributed\nkept = rank").ok()
    pids = _pids(kernel)
    cell = kernel.run(f"%%distributed\nif rank == 1:\n    {death}\ntime.sleep(30)", timeout=30)
    text = _error_text(cell)
    assert cell.error is not None and cell.error["ename"] == "WorkerError"
    assert f"rank 1 failed: {named}" in text
    assert "the live session was restarted: its state is gone" in text
    _nothing_left(pids)
    status = json.loads(kernel.run(STATUS).ok().stdout)  # the new ranks came up before the cell returned
    assert [r["state"] for r in status] == ["idle", "idle"] and not set(pids) & {r["pid"] for r in status}
    assert kernel.run("%%distributed\n'kept' in globals(), rank").ok().result["text/plain"] == "(False, 0)"


def test_timeout_stops_the_cell_and_the_next_cell_works(kernel):
    kernel.run("%%distributed\ntimed = rank").ok()
    t0 = time.monotonic()
    cell = kernel.run("%%distributed --timeout 1\ntime.sleep(60)", timeout=30)
    assert cell.error is not None and cell.error["ename"] == "LaunchTimeoutError"
    assert time.monotonic() - t0 < 5
    assert "exceeded timeout=1s" in _error_text(cell)
    assert kernel.run("%%distributed\ntimed").ok().result["text/plain"] == "0"


def test_an_unchanged_200mb_tensor_crosses_once(kernel):
    kernel.run("import torch\nbig = torch.ones(50_000_000)").ok()  # defined after start: the ranks lack it
    before = int(kernel.run("from kernelside.live.session import current\nprint(current().names.names_bytes)").stdout)
    for _ in range(10):
        kernel.run("%%distributed\ntotal = big.sum().item()").ok()
    after = int(kernel.run("print(current().names.names_bytes)").stdout)
    assert 200e6 <= after - before < 201e6
    kernel.run("big.add_(1)").ok()  # changed in place: sent again
    kernel.run("%%distributed\nassert big[0].item() == 2.0").ok()
    assert int(kernel.run("print(current().names.names_bytes)").stdout) - after >= 200e6
    kernel.run("del big").ok()


def test_push_sends_a_kernel_value_to_every_rank(kernel):
    kernel.run("%%distributed\ncfg = 'rank value'").ok()
    kernel.run("cfg = {'lr': 0.5}").ok()
    kernel.run("%distributed_push cfg").ok()
    cell = kernel.run("%%distributed --return-from all --return c\nc = cfg").ok()
    assert cell.error is None and kernel.run("print(c)").ok().stdout.strip() == "[{'lr': 0.5}, {'lr': 0.5}]"


def test_an_unsendable_name_is_named_and_nothing_runs(new_kernel):
    k = new_kernel(load_ext=False)
    k.run("%load_ext kernelside\n%distributed_start -n 2 --start-method spawn").ok()
    k.run("import threading\nlock = threading.Lock()").ok()
    cell = k.run("%%distributed\nwith lock:\n    pass")
    assert cell.error is not None and "'lock' (lock)" in _error_text(cell)
    assert k.run("%%distributed\nrank").ok().result["text/plain"] == "0"


KERNEL_FDS = """
import os
def _our_fds():  # IPython's own history database opens and closes as it likes: not ours
    out = []
    for f in os.listdir('/proc/self/fd'):
        try:
            target = os.readlink(f'/proc/self/fd/{f}')
        except OSError:
            continue
        if 'history.sqlite' not in target:
            out.append(target)
    return sorted(out)
print(len(_our_fds()))
"""
FD_TARGETS = KERNEL_FDS.replace("print(len(_our_fds()))", "print(_our_fds())")


def _fds_settle_to(k, expected: int, timeout: float = 5.0) -> int:
    """The kernel's fd count once it is back to ``expected``, or the last count after ``timeout`` (then the
    fds are printed). Under load one extra fd was seen right after a stop and not again alone: a descriptor
    another thread closes a moment later (torch's store, ZMQ) is the guess; a real leak still fails."""
    deadline = time.monotonic() + timeout
    while True:
        count = int(k.run(KERNEL_FDS).ok().stdout)
        if count == expected or time.monotonic() > deadline:
            if count != expected:
                print("kernel fds now:", k.run(FD_TARGETS).ok().stdout)
            return count


def _nothing_left(rank_pids: list[int]) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(psutil.pid_exists(p) for p in rank_pids):
        time.sleep(0.05)
    assert not any(psutil.pid_exists(p) for p in rank_pids)


def test_stop_and_restart_leave_no_process_port_or_fd(new_kernel):
    k = new_kernel()
    k.run("%distributed_start -n 2\n%distributed_stop").ok()  # what the first session opens for good (torch)
    fds_before = int(k.run(KERNEL_FDS).ok().stdout)
    k.run("%distributed_start -n 2").ok()
    port = int(k.run("from kernelside.live.session import current\nprint(current().world.port)").stdout)
    first = _pids(k)
    cell = k.run("%distributed_restart").ok()
    assert "its state is gone" in cell.stdout
    second = _pids(k)
    assert not set(first) & set(second) and not any(psutil.pid_exists(p) for p in first)
    k.run("%distributed_stop").ok()
    _nothing_left(second)
    assert _fds_settle_to(k, fds_before) == fds_before
    assert port not in {c.laddr.port for c in psutil.Process(k.pid).net_connections() if c.laddr}
    assert "live session: none" in k.run("%distributed_config").ok().stdout


@pytest.mark.kernel  # it ends the kernel itself
@pytest.mark.parametrize("how", ["shutdown", "sigkill"])
def test_kernel_shutdown_or_death_takes_the_ranks_with_it(how):
    k = Kernel()
    k.run("%load_ext kernelside\n%distributed_start -n 2").ok()
    pids = _pids(k)
    if how == "shutdown":
        k.shutdown()
    else:
        psutil.Process(k.pid).kill()
        k.kc.stop_channels()
    _nothing_left(pids)
    if how == "sigkill":
        k.km.shutdown_kernel(now=True)


def test_spawn_started_session_keeps_state_and_gets_kernel_functions(new_kernel):
    k = new_kernel(load_ext=False)
    k.run("%load_ext kernelside\n%distributed_start -n 2 --start-method spawn").ok()
    k.run("def double(v):\n    return 2 * v").ok()
    k.run("%%distributed\nacc = double(rank + 1)").ok()
    k.run("%distributed_config").ok()
    cell = k.run("%%distributed --return-from all --return a\na = acc").ok()
    assert cell.error is None and k.run("print(a)").ok().stdout.strip() == "[2, 4]"
    cell = k.run("%%distributed\nif rank == 1:\n    raise RuntimeError('spawned failure')\nacc")
    assert "rank 1 failed: RuntimeError: spawned failure" in _error_text(cell)
    assert k.run("%%distributed\nacc").ok().result["text/plain"] == "2"


def test_function_form_runs_keeps_state_and_stops_as_a_context_manager(new_kernel):
    k = new_kernel(load_ext=False)
    k.run("import kernelside, os").ok()
    k.run(
        "def load():\n    global weights\n    weights = [rank] * 3\n"
        "def total(extra):\n    return sum(weights) + extra + bonus\nbonus = 100"
    ).ok()
    cell = k.run(
        "with kernelside.start(num_processes=2) as ranks:\n    ranks.run(load)\n"
        "    one = ranks.run(total, args=(1,))\n    every = ranks.run(total, args=(1,), return_all=True)\n"
        "    ranks.push(bonus=0)\n    after_push = ranks.run(total, args=(1,))\n"
        "    pids = [r['pid'] for r in ranks.status()]\nprint(one, every, after_push)"
    ).ok()
    assert cell.stdout.strip() == "101 [101, 104] 1"
    pids = json.loads(k.run("import json\nprint(json.dumps(pids))").ok().stdout)
    _nothing_left(pids)


def test_200_cell_soak_keeps_fds_threads_and_memory_flat(new_kernel):
    k = new_kernel(load_ext=False)
    probe = KERNEL_FDS.replace(
        "print(len(_our_fds()))",
        "import threading, psutil, json\nfrom kernelside.live.session import current\n"
        "print(json.dumps({'fds': len(_our_fds()), 'threads': threading.active_count(), "
        "'rss': psutil.Process().memory_info().rss, 'ranks': [r['rss'] for r in current().status()]}))",
    )
    k.run("%load_ext kernelside\n%distributed_start -n 2").ok()
    for _ in range(20):  # warm: first-use allocations (caches, widgets) are not growth
        k.run("%%distributed\nx = [rank] * 1000\nlen(x)").ok()
    first = json.loads(k.run(probe).ok().stdout)
    for i in range(200):
        k.run(f"%%distributed\nx = [rank] * 1000\nlen(x) + {i}").ok()
    last = json.loads(k.run(probe).ok().stdout)
    print("soak first", first, "last", last)
    if last["fds"] != first["fds"]:
        last["fds"] = _fds_settle_to(k, first["fds"])
    assert last["fds"] == first["fds"] and last["threads"] == first["threads"]
    assert last["rss"] - first["rss"] < 20 * 2**20
    assert all(b - a < 20 * 2**20 for a, b in zip(first["ranks"], last["ranks"], strict=True))


KERNEL_GROUP = (  # the kernel's own process group: forked ranks inherit it, so their init_process_group fails
    "import tempfile, torch.distributed as dist\n"
    "dist.init_process_group('gloo', init_method='file://' + tempfile.mktemp(), rank=0, world_size=1)"
)


def test_a_restart_whose_new_ranks_cannot_start_says_so_then_and_stops_the_session(new_kernel):
    k = new_kernel(load_ext=False)
    k.run("%load_ext kernelside\nimport os, time\n%distributed_start -n 2").ok()
    first = _pids(k)
    k.run(KERNEL_GROUP).ok()
    cell = k.run("%distributed_restart", timeout=60)
    text = _error_text(cell)
    assert cell.error is not None and cell.error["ename"] == "LaunchError"
    assert "the live session was restarted, but its new ranks did not come up (rank " in text
    assert "trying to initialize the default process group twice" in text
    assert "The live session is stopped and nothing is left running" in text
    _nothing_left(first)
    assert k.children() == []  # but the forkserver template, which a GPU machine starts with the extension
    assert "live session: none" in k.run("%distributed_config").ok().stdout

    # the automatic restart, after a rank died in a cell, says it in that cell
    k.run("dist.destroy_process_group()\n%distributed_start -n 2").ok()
    second = _pids(k)
    k.run(KERNEL_GROUP).ok()
    cell = k.run("%%distributed\nif rank == 1:\n    os._exit(3)\ntime.sleep(30)", timeout=60)
    text = _error_text(cell)
    assert cell.error is not None and cell.error["ename"] == "WorkerError"  # the cell's own error comes first
    order = [
        "rank 1 failed: exit code 3",
        "the live session was restarted: its state is gone",
        "the new ranks of that restart did not come up (rank ",
        "failed during init_process_group: ValueError: trying to initialize the default process group twice",
        "The live session is stopped and nothing is left running",
    ]
    assert all(part in text for part in order), text
    assert sorted(order, key=text.index) == order, text
    _nothing_left(second)
    assert k.children() == []  # but the forkserver template, which a GPU machine starts with the extension
    k.run("dist.destroy_process_group()\n%distributed_start -n 2").ok()  # the cause gone: a session starts
    assert k.run("%%distributed\nrank").ok().result["text/plain"] == "0"
    k.run("%distributed_stop").ok()
