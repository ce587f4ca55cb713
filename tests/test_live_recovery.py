"""A failed live cell costs nothing but the cell: with 3 and 4 ranks in a real kernel, a rank failing
while its peers wait in a collective (all_reduce, DDP backward), mismatched collectives, a --timeout
in a C-level collective and ten failures in a row leave every rank's process, namespace and DDP model
working, and nothing behind. (2 ranks, barrier and ■: tests/test_live_ranks.py.)"""

from __future__ import annotations

import json
import re
import time

import pytest
from kernel import Kernel

STATUS = "import json\nfrom kernelside.live.session import current\nprint(json.dumps(current().status()))"
DDP = (
    "%%distributed\nimport torch, torch.distributed as dist\ntorch.manual_seed(0)\n"
    "model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))\n"
    "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nloaded = f'weights of rank {rank}'"
)
# one DDP step, then every rank checks that every rank's gradient is the same (all_gather)
STEP_IN_SYNC = (
    "%%distributed --return-from all --return in_sync\nopt.zero_grad()\n"
    "model(torch.randn(8, 4) * (rank + 1)).sum().backward()\ng = model.module.weight.grad.clone()\n"
    "gs = [torch.zeros_like(g) for _ in range(world_size)]\ndist.all_gather(gs, g)\n"
    "in_sync = (all(torch.equal(gs[0], h) for h in gs), loaded)\nopt.step()"
)


def _start(start_kernel, n: int) -> Kernel:
    return start_kernel("import os, time, signal", f"%distributed_start -n {n}", DDP)


@pytest.fixture(scope="module")
def three(kernel_with):
    k = _start(kernel_with, 3)
    yield k
    k.run("%distributed_stop")


def _pids(k: Kernel) -> list[int]:
    return [r["pid"] for r in json.loads(k.run(STATUS).ok().stdout)]


def _text(cell) -> str:
    return "\n".join(cell.error["traceback"]) if cell.error else ""


def _assert_state_and_step_in_sync(k: Kernel, n: int) -> None:
    k.run(STEP_IN_SYNC).ok()
    got = k.run("print(in_sync)").ok().stdout.strip()
    assert got == str([(True, f"weights of rank {r}") for r in range(n)])


def test_rank_error_while_peers_wait_in_all_reduce_keeps_state_and_pids_with_3_ranks(three):
    pids = _pids(three)
    t0 = time.monotonic()
    cell = three.run(  # rank 1 fails a second in, while its peers wait in the all_reduce
        "%%distributed\nt = torch.ones(1)\nif rank == 1:\n"
        "    time.sleep(1); raise ValueError('rank 1 broke')\ndist.all_reduce(t)",
        timeout=30,
    )
    elapsed = time.monotonic() - t0
    text = _text(cell)
    assert cell.error["ename"] == "WorkerError" and "rank 1 failed: ValueError: rank 1 broke" in text
    assert "rank 0: cell " in text and "waiting in torch.distributed.all_reduce()" in text
    assert "rank 2: " in text.split("Where the other ranks were:")[1]
    assert "rebuilt in the same processes: every rank kept its state" in text and "restarted" not in text
    assert elapsed < 8, elapsed  # (1 s of it is the failing rank's own sleep; bench.live_recovery times it)
    assert _pids(three) == pids
    _assert_state_and_step_in_sync(three, 3)


def test_rank_error_before_ddp_backward_keeps_every_ddp_model_training_in_sync_with_3_ranks(three):
    pids = _pids(three)
    cell = three.run(
        "%%distributed\nx = torch.randn(8, 4)\nif rank == 2:\n"
        "    time.sleep(1); raise RuntimeError('bad batch on rank 2')\n"
        "model(x).sum().backward()",
        timeout=30,
    )
    text = _text(cell)
    assert "rank 2 failed: RuntimeError: bad batch on rank 2" in text
    # both peers wait at line 5: in backward's all-reduce, or in DDP's forward (its bucket sync is C++ only)
    assert text.split("Where the other ranks were:")[1].count("line 5") == 2
    assert "every rank kept its state" in text
    assert _pids(three) == pids
    _assert_state_and_step_in_sync(three, 3)


def test_mismatched_collectives_are_named_with_each_ranks_call_and_sequence_number(three):
    t0 = time.monotonic()
    cell = three.run(
        "%%distributed\nif rank == 0:\n    dist.barrier()\nelse:\n    dist.all_reduce(torch.ones(1))", timeout=60
    )
    elapsed = time.monotonic() - t0
    text = _text(cell)
    assert "the ranks called different collectives, which can never complete" in text
    assert "rank 0: cell " in text and "line 3, waiting in torch.distributed.barrier() (collective #" in text
    assert "rank 1: cell " in text and "rank 2: cell " in text
    assert "waiting in torch.distributed.all_reduce() (collective #" in text
    assert elapsed < 10, elapsed
    _assert_state_and_step_in_sync(three, 3)


def test_a_collective_its_peers_never_join_is_named_when_they_finish_the_cell(three):
    cell = three.run("%%distributed\nif rank == 0:\n    dist.barrier()", timeout=60)
    text = _text(cell)
    assert "rank 0: cell " in text and "waiting in torch.distributed.barrier() (collective #" in text
    assert "rank(s) 1, 2 never joined: they finished the cell" in text
    # the collective count each finished rank ended at, and nothing about ranks on different groups
    assert re.search(r"they finished the cell \(rank 1 at collective #\d+, rank 2 at collective #\d+\)", text), text
    assert "different process groups" not in text
    _assert_state_and_step_in_sync(three, 3)


def test_timeout_with_a_rank_in_a_c_level_collective_keeps_state_and_says_where_each_rank_was(three):
    t0 = time.monotonic()
    cell = three.run("%%distributed --timeout 1\nif rank == 0:\n    dist.barrier()\nelse:\n    time.sleep(60)")
    text = _text(cell)
    assert cell.error["ename"] == "LaunchTimeoutError" and time.monotonic() - t0 < 6
    assert "rank 0: cell " in text and "line 3, waiting in torch.distributed.barrier()" in text
    assert "rank 1: cell " in text and "line 5" in text
    assert "every rank kept its state" in text
    _assert_state_and_step_in_sync(three, 3)


def test_ten_failures_in_a_row_leave_fds_threads_and_pids_flat(three):
    three.run("%%distributed\nif rank == 1:\n    raise ValueError('warm up')\ndist.barrier()")
    before = three.process_counts()
    for i in range(10):
        cell = three.run(f"%%distributed\nif rank == {i % 3}:\n    raise ValueError('again')\ndist.barrier()")
        assert "every rank kept its state" in _text(cell), _text(cell)
    assert three.process_counts() == before
    _assert_state_and_step_in_sync(three, 3)


def test_four_ranks_a_failing_rank_that_is_not_every_peers_neighbour_unblocks_them_all(new_kernel):
    k = _start(new_kernel, 4)
    try:
        pids = _pids(k)
        cell = k.run(
            "%%distributed\nx = torch.randn(8, 4)\nif rank == 3:\n    raise ValueError('rank 3 only')\n"
            "model(x).sum().backward()",
            timeout=30,
        )
        text = _text(cell)
        assert "rank 3 failed: ValueError: rank 3 only" in text and "every rank kept its state" in text
        (where,) = [line for line in text.splitlines() if line.startswith("Where the other ranks were:")]
        for r in (0, 1, 2):  # (under load a peer may not have begun the cell when rank 3 failed: said so)
            assert f"rank {r}: " in where
        assert _pids(k) == pids
        _assert_state_and_step_in_sync(k, 4)
    finally:
        k.run("%distributed_stop")


def test_debug_after_a_failed_live_cell_opens_the_failing_ranks_frame_in_the_cell_and_q_keeps_every_rank(three):
    three.run("%%distributed\nkept = rank * 10").ok()
    cell = three.run(
        "%%distributed\nif rank == 2:\n    local_x = 40 + rank\n    raise ValueError('rank 2 broke')\ndist.barrier()"
    )
    assert "rank 2 failed: ValueError: rank 2 broke" in _text(cell)
    answers = iter(["p local_x", "p kept", "up", "q"])
    debugged = three.run("%debug", timeout=60, on_input=lambda prompt, password: next(answers))
    assert debugged.error is None
    assert [r["prompt"] for r in debugged.input_requests] == ["(rank 2) (Pdb) "] * 4
    out = debugged.stdout
    assert "<%%distributed cell" in out and "(4)<module>()" in out and "raise ValueError('rank 2 broke')" in out
    assert "\n42\n" in out and "\n20\n" in out  # the rank's own locals and globals
    assert "Oldest frame" in out  # the cell is the bottom of the stack: no nblaunch frame above it
    assert "kernelside" not in out
    _assert_state_and_step_in_sync(three, 3)
    # any other exception: IPython's own debugger, unchanged
    three.run("1 / 0")
    plain = three.run("%debug", timeout=60, on_input=lambda prompt, password: "q")
    assert [r["prompt"] for r in plain.input_requests] == ["ipdb> "]


def test_the_rebuilt_group_keeps_the_collective_timeout_the_users_code_gave(three):
    three.run(
        "%%distributed\nimport datetime\nfrom kernelside.worker.live_rescue import group_timeout\n"
        "dist.init_process_group('gloo', timeout=datetime.timedelta(seconds=42))"
    ).ok()
    cell = three.run("%%distributed\nif rank == 0:\n    time.sleep(1); raise ValueError('x')\ndist.barrier()")
    assert "the process group was rebuilt" in _text(cell)
    after = three.run(
        "%%distributed --return-from all --return s\ns = group_timeout(dist.distributed_c10d._get_default_group())"
    ).ok()
    assert three.run("print([t.total_seconds() for t in s])").ok().stdout.strip() == "[42.0, 42.0, 42.0]", after
    three.run("%%distributed\ndist.init_process_group('gloo', timeout=datetime.timedelta(hours=2))").ok()


def test_a_group_the_user_made_with_new_group_is_named_after_the_rebuild_with_what_to_do(three):
    three.run("%%distributed\nsub = dist.new_group([0, 1, 2])").ok()
    cell = three.run("%%distributed\nif rank == 0:\n    time.sleep(1); raise ValueError('x')\ndist.barrier()")
    text = _text(cell)
    assert "every rank kept its state" in text
    assert "sub still hold(s) a process group made before the rebuild" in text and "dist.new_group(...)" in text
    _assert_state_and_step_in_sync(three, 3)
    # the same after ■ with ranks in a collective: the short interrupt error names it too
    three.run("%%distributed\nsub = dist.new_group([0, 1, 2])").ok()
    sent = {}

    def on_output(kind, content):
        if "waiting" in content.get("text", "") and not sent:
            sent["t"] = True
            three.interrupt()

    cell = three.run(
        "%%distributed\nprint('waiting', flush=True)\nif rank == 0:\n    dist.barrier()\nelse:\n    time.sleep(60)",
        timeout=60,
        on_output=on_output,
    )
    assert cell.error is not None and cell.error["ename"] == "KeyboardInterrupt"
    assert "every rank stopped the cell and kept its state" in cell.error["evalue"]
    assert "sub still hold(s) a process group made before the rebuild" in cell.error["evalue"]
    _assert_state_and_step_in_sync(three, 3)


# rank 1 holds SIGINT off (as code that masks signals around a C call does) for a while: alive, but slow to come back
SLOW_RANK = (
    "%%distributed\nt = torch.ones(1)\nif rank == 1:\n"
    "    signal.pthread_sigmask(signal.SIG_BLOCK, {{signal.SIGINT}}); time.sleep({hold})\n"
    "    signal.pthread_sigmask(signal.SIG_UNBLOCK, {{signal.SIGINT}})\n"
    "if rank == 0:\n    time.sleep(0.5); raise ValueError('rank 0 broke')\ndist.all_reduce(t)"
)


def _awaited_notice(cell) -> list[str]:
    return [line for line in cell.stderr.splitlines() if "Still waiting for rank(s)" in line]


def test_a_rank_alive_but_slow_to_come_back_is_waited_for_with_its_state_and_named_meanwhile(three):
    """No fixed budget costs a slow rank its state: the cell names the failure and the rank it waits for (and
    where) once, then ends when the rank is back, with every rank's state and process kept."""
    three.run("%%distributed\nkept = rank * 10").ok()
    pids = _pids(three)
    cell = three.run(SLOW_RANK.format(hold=6), timeout=60)
    (notice,) = _awaited_notice(cell)
    assert "rank 0 failed (ValueError: rank 0 broke)" in notice and "rank(s) 1 to come back to idle" in notice
    assert "rank 1: cell " in notice and "Press ■ again to stop waiting" in notice
    text = _text(cell)
    assert "rank 0 failed: ValueError: rank 0 broke" in text and "every rank kept its state" in text
    assert "restarted" not in text
    assert _pids(three) == pids
    three.run("%%distributed --return-from all --return kept\nkept").ok()
    assert three.run("print(kept)").ok().stdout == "[0, 10, 20]\n"
    _assert_state_and_step_in_sync(three, 3)


def test_interrupt_again_while_a_rank_is_awaited_restarts_the_session_and_says_why(new_kernel):
    """■ again is the user asking: the wait is given up, the world restarted (new processes), and the error says so."""
    k = _start(new_kernel, 2)
    try:
        pids = _pids(k)
        sent = {}

        def on_output(kind, content):
            if "Still waiting for rank(s)" in content.get("text", "") and not sent:
                sent["t"] = time.monotonic()
                k.interrupt()

        cell = k.run(SLOW_RANK.format(hold=120), timeout=60, on_output=on_output)
        assert sent, cell.outputs
        assert cell.error is not None and cell.error["ename"] == "KeyboardInterrupt"
        assert time.monotonic() - sent["t"] < 10
        said = cell.stderr + _text(cell) + cell.error["evalue"]
        assert "■ was pressed again while rank(s) 1 had not come back to idle" in said, said
        assert "the live session was restarted: its state is gone" in said
        assert set(_pids(k)).isdisjoint(pids)
        k.run("%%distributed\nx = rank").ok()
    finally:
        k.run("%distributed_stop")
