"""Rank 0's input(), getpass() and pdb are answered through the kernel's stdin channel, as in a cell;
other ranks' input() gets a clear error (their debuggers prompt: test_rank_debugger.py); a frontend
without stdin gets the kernel's own error; nothing hangs."""

from __future__ import annotations

import time

import pytest
from harness import answers


@pytest.fixture(scope="module")
def kernel(kernel_with, tmp_path_factory):
    return kernel_with("import sys, time", cwd=tmp_path_factory.mktemp("stdin"))


def _error_text(cell) -> str:
    assert cell.error is not None, cell.outputs
    return "\n".join(cell.error["traceback"])


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_input_on_rank_0_is_answered_through_the_kernels_stdin_channel(kernel, start_method):
    cell = kernel.run(
        f"""%%distributed -n 2 --start-method {start_method} --return name
print("asking")
name = input("name? ") if rank == 0 else None
import getpass
secret = getpass.getpass("token: ") if rank == 0 else None
print("hello", name, len(secret or ""))
""",
        on_input=answers("Ada", "s3cret"),
    ).ok()
    assert cell.input_requests == [
        {"prompt": "name? ", "password": False},
        {"prompt": "token: ", "password": True},
    ]
    assert cell.stdout == "asking\nhello Ada 6\n"
    assert kernel.run("print(name)").ok().stdout == "Ada\n"


def test_prompt_comes_after_the_text_printed_before_it(kernel):
    # the kernel's order (header dates), not the arrival order: iopub and stdin are separate sockets
    cell = kernel.run(
        """%%distributed -n 2
if rank == 0:
    for i in range(200):
        print("line", i)
    input("go? ")
""",
        on_input=lambda prompt, password: "ok",
    ).ok()
    asked_at = cell.input_request_dates[0]
    sent = [(d, c.get("text", "")) for (_, c), d in zip(cell.outputs, cell.output_dates, strict=True)]
    before = "".join(text for d, text in sent if d <= asked_at)
    assert before.endswith("line 199\n") and "line 0\n" in before, before[-200:]
    assert "line" not in "".join(text for d, text in sent if d > asked_at)


def test_pdb_session_on_rank_0_prints_and_steps_and_continues(kernel):
    cell = kernel.run(
        """%%distributed -n 2
x = 41
if rank == 0:
    breakpoint()
    y = x + 1
    print("y is", y)
import torch.distributed as dist
dist.barrier()
""",
        on_input=answers("p x", "n", "p y", "c"),
    ).ok()
    assert [r["prompt"] for r in cell.input_requests] == ["(rank 0) (Pdb) "] * 4  # the prompt names the rank
    lines = cell.stdout.splitlines()
    assert lines[0].startswith("> <%%distributed cell In[") and lines[0].endswith("]>(5)<module>()")
    assert lines[1] == "-> y = x + 1"
    assert "41" in lines and "42" in lines and lines[-1] == "y is 42"


def test_q_in_pdb_stops_the_launch_with_a_clear_message(kernel):
    started = time.monotonic()
    cell = kernel.run(
        """%%distributed -n 2
import pdb, torch.distributed as dist
if rank == 0:
    pdb.set_trace()
    print("not reached")
dist.barrier()
""",
        on_input=answers("q"),
    )
    text = _error_text(cell)
    assert "the debugger on rank 0 was quit (q); the launch was stopped on every rank" in text.splitlines()[0]
    assert "not reached" not in cell.stdout.splitlines()  # (the listing shows the line; it never ran)
    assert time.monotonic() - started < 30
    assert kernel.run("from kernelside import last_report\nprint(last_report().outcome)").ok().stdout == "failed\n"


def test_input_on_rank_1_is_a_clear_error_naming_the_rank(kernel):
    cell = kernel.run("""%%distributed -n 2
answer = input("rank 1 asks: ") if rank == 1 else None
""")
    text = _error_text(cell)
    assert "rank 1 failed: RankInputError: only rank 0 can read from the notebook; rank 1 called " in text
    assert "input('rank 1 asks: ')" in text


def test_without_stdin_in_the_frontend_rank_0_raises_stdin_not_implemented(kernel):
    cell = kernel.run("""%%distributed -n 2
value = input("nobody can answer: ") if rank == 0 else None
""")  # no on_input: the request does not allow stdin, as with nbclient / papermill
    text = _error_text(cell)
    assert "rank 0 failed: StdinNotImplementedError: raw_input was called, but this frontend does not support" in text


def test_a_peer_failing_while_rank_0_waits_for_the_user_stops_the_launch_and_stdin_still_works(kernel):
    kc = kernel.kc
    started = time.monotonic()
    msg_id = kc.execute(
        """%%distributed -n 2
if rank == 0:
    input("waiting: ")
else:
    time.sleep(1.0)
    raise ValueError("rank 1 broke")
""",
        allow_stdin=True,
    )
    request = kc.get_stdin_msg(timeout=60)  # the frontend is asked ... and nobody answers
    assert request["content"]["prompt"] == "waiting: "
    reply = kernel.reply_to(msg_id)
    assert reply["content"]["status"] == "error"
    assert "ValueError: rank 1 broke" in "\n".join(reply["content"]["traceback"])
    assert time.monotonic() - started < 30
    # the withdrawn question left no reader on the stdin channel: a plain input() in the kernel works
    after = kernel.run("print('kernel got', input('again? '))", on_input=answers("late answer")).ok()
    assert after.stdout == "kernel got late answer\n"
    assert after.input_requests == [{"prompt": "again? ", "password": False}]


def test_interrupting_the_kernel_while_rank_0_waits_for_input_stops_the_launch(kernel):
    kc = kernel.kc
    msg_id = kc.execute('%%distributed -n 2\nif rank == 0:\n    input("waiting: ")\n', allow_stdin=True)
    assert kc.get_stdin_msg(timeout=60)["content"]["prompt"] == "waiting: "
    sent = time.monotonic()
    kernel.interrupt()
    reply = kernel.reply_to(msg_id)
    assert reply["content"]["ename"] == "KeyboardInterrupt"
    assert time.monotonic() - sent < 5
    after = kernel.run("print('kernel got', input('again? '))", on_input=answers("yes")).ok()
    assert after.stdout == "kernel got yes\n"
