"""A rank's stacks answer in faulthandler's text, written from ``sys._current_frames()`` by the answering
thread (``worker/stack_answer.py``), read back by the kernel's parser (``launch/rank_stacks.parse_dump``):
another thread's frames, innermost last once parsed, with the detail line naming what it calls."""

from __future__ import annotations

import json
import sys
import threading
import time

from kernelside.launch.rank_stacks import parse_dump
from kernelside.worker.stack_answer import DETAIL, MAX_DEPTH, dump, main_detail


def _waiting_thread(depth: int):
    started, stop = threading.Event(), threading.Event()

    def inner(n):
        if n:
            return inner(n - 1)
        started.set()
        while not stop.is_set():
            time.sleep(0.005)

    t = threading.Thread(target=inner, args=(depth,), daemon=True)
    t.start()
    assert started.wait(10)
    return t, stop


def test_another_threads_stack_is_written_in_faulthandlers_text_and_parsed_back():
    t, stop = _waiting_thread(3)
    try:
        frames = sys._current_frames()
        text = dump(frames, threading.get_ident())
        text += DETAIL + json.dumps(main_detail(frames[t.ident])) + "\n"
    finally:
        stop.set()
        t.join()
    assert f"Thread 0x{t.ident:016x} (most recent call first):" in text
    assert f"Current thread 0x{threading.get_ident():016x} (most recent call first):" in text
    got = parse_dump(text, f"0x{t.ident:016x}")
    functions = [f["function"] for f in got["frames"]]
    assert functions[-4:] == ["inner"] * 4, functions  # outermost first: the innermost is last
    assert got["frames"][-1]["file"] == __file__, got["frames"][-1]
    assert got["source"] == "time.sleep(0.005)" and got["calling"] == "sleep", got
    assert all(th["thread"] != f"0x{threading.get_ident():016x}" for th in got["threads"])  # the answerer's own


def test_a_deep_stack_is_cut_at_faulthandlers_depth():
    t, stop = _waiting_thread(MAX_DEPTH + 20)
    try:
        text = dump({t.ident: sys._current_frames()[t.ident]}, threading.get_ident())
    finally:
        stop.set()
        t.join()
    lines = text.splitlines()
    assert sum(1 for line in lines if line.startswith('  File "')) == MAX_DEPTH
    assert lines[-2] == "  ..." and lines[-1] == ""
