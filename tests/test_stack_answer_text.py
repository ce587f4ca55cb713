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


def test_a_rank_with_no_frame_of_the_users_is_said_in_words_never_by_nblaunchs_file_paths():
    import os

    import kernelside

    worker = os.path.join(os.path.dirname(kernelside.__file__), "worker")

    def text(*frames):  # faulthandler's text, innermost first, for a main thread 0x1
        lines = ["Thread 0x0000000000000001 (most recent call first):"]
        lines += [f'  File "{path}", line {line} in {fn}' for path, line, fn in frames]
        return "\n".join(lines) + "\n"

    lifecycle = (os.path.join(worker, "lifecycle.py"), 90, "run_work")
    posting = text((os.path.join(worker, "sharded_results.py"), 231, "_post"), lifecycle)
    assert parse_dump(posting, "0x0000000000000001")["where"] == "after the cell's code, sending its result"
    other = text((os.path.join(worker, "live_rank.py"), 12, "_serve"), lifecycle)
    assert parse_dump(other, "0x0000000000000001")["where"] == "in nblaunch, outside the cell's code"
    importing = text(("/usr/lib/python3/dist-packages/torch/__init__.py", 5, "<module>"), lifecycle)
    assert parse_dump(importing, "0x0000000000000001")["where"].startswith("/usr/lib/python3/dist-packages/torch")
