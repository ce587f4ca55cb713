"""The kernel side of the ranks' prompts (kernelside/display/stdin_relay.py), without a kernel: its wake-up pipe
exists only once a rank asks (most cells ask nothing), and the loop learns of it then."""

from __future__ import annotations

import builtins
import os
import select

from kernelside.channel import EventReader
from kernelside.display.stdin_relay import StdinRelay


def _fds() -> set[int]:
    return {int(fd) for fd in os.listdir("/proc/self/fd")}


def test_a_relay_no_rank_asks_opens_no_pipe_and_closes_cleanly():
    before = _fds()
    told = []
    relay = StdinRelay(on_wake_fd=told.append)
    assert relay.wake_fd == -1 and told == [] and not relay.waiting
    relay.close()
    relay.close()
    assert _fds() == before


def test_the_first_question_makes_the_pipe_tells_the_loop_once_and_the_answer_reaches_the_rank(monkeypatch):
    prompts = []
    monkeypatch.setattr(builtins, "input", lambda prompt="": prompts.append(prompt) or f"answer {len(prompts)}")
    before = _fds()
    told = []
    relay = StdinRelay(on_wake_fd=told.append)
    reply_r, reply_w = os.pipe()
    try:
        for n in (1, 2):
            relay.ask(reply_w, {"id": n, "prompt": f"question {n}? ", "password": False})
            assert told == [relay.wake_fd] and relay.wake_fd >= 0  # made by the first question only
            assert select.select([relay.wake_fd], [], [], 30)[0] == [relay.wake_fd]  # the answer wakes the loop
            relay.on_wake()
            got = list(EventReader().feed(os.read(reply_r, 65536)))
            assert got == [("input_reply", {"id": n, "value": f"answer {n}"})]
        assert prompts == ["question 1? ", "question 2? "]
    finally:
        relay.close()
        os.close(reply_r)
        os.close(reply_w)
    assert _fds() == before
