"""A rank's answer to "where are you?": every thread's Python stack, written by a thread of its own.

``install(path)`` makes, in the rank's run folder (by the folder's descriptor, owner-only):

- ``rank<N>.stacks.ask``, a FIFO the kernel writes a byte into to ask (``launch/rank_stacks.py``);
- ``rank<N>.stacks``, the latest answer: a first line ``nblaunch-stacks main=0x<id> answer=<n>`` (which
  thread is the rank's main thread, and how many answers it has given), then every thread's stack in ``faulthandler``'s
  text format, then ``nblaunch-detail {json}`` (``main_detail``).

A daemon thread, ``nblaunch-stacks``, waits on the FIFO and writes each answer under a temporary name,
renamed over ``rank<N>.stacks`` when whole: the kernel reads only finished answers. The answer is written
in faulthandler's text, from ``sys._current_frames()``, holding the GIL: every other Python thread is parked
and the snapshot is taken under the interpreter's thread-list lock. Two ways that crashed ranks with SIGSEGV
are not used: a faulthandler signal handler (any thread could take a process-directed signal, gloo's
included, and walked the other threads' frames while they ran), and ``faulthandler.dump_traceback(
all_threads=True)`` called from Python, which walks the thread list without that lock: on CPython 3.11 a
thread state that torch's C++ threads create as they take the GIL is linked before it is filled in, and
reading it crashed a rank in 4 of 6 runs of ``tests/test_stacks_under_load.py`` (an 8,000-ask soak). A main
thread blocked in a collective has released the GIL, so the rank still answers at once. Requests that arrive
while an answer is written are answered by that one (the FIFO's bytes are read together).

Example::

    >>> install(stacks_path(run_dir, 0))      # doctest: +SKIP  (start_rank does this)
"""

from __future__ import annotations

import json
import os
import stat
import sys
import threading

from ..run_contract import rank_stacks_name
from ..short_traceback import is_nblaunch_file
from .call_site import calling_of, source_line

DETAIL = "nblaunch-detail "  # last line of an answer: the main thread's source line and the C function it calls
HEADER = "nblaunch-stacks main=0x"  # first line of a rank's answer: which thread is its main thread, and its count
ASK_SUFFIX = ".ask"  # rank<N>.stacks.ask: the FIFO a request is written into
MAX_DEPTH = 100  # frames written per thread, innermost first (faulthandler's own limit)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def stacks_path(run_dir: str, rank: int) -> str:
    """Where rank ``rank`` of the run in ``run_dir`` answers (the rank and the kernel agree on it)."""
    return os.path.join(run_dir, rank_stacks_name(rank))


def header(main_ident: int, answers: int) -> str:
    """The first line of an answer file (``launch/rank_stacks.py`` parses it)."""
    return f"{HEADER}{main_ident:x} answer={answers}\n"


def install(path: str) -> threading.Thread | None:
    """Answer every request written into ``path + ASK_SUFFIX`` with every thread's stack in ``path``."""
    if not path:
        return None
    folder, name = os.path.split(path)
    dir_fd = os.open(folder, _DIR_FLAGS)
    try:
        st = os.fstat(dir_fd)
        if st.st_uid != os.getuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise PermissionError(f"nblaunch: {folder} is not a private folder of this user's: no stacks file made")
        ask = name + ASK_SUFFIX
        try:
            os.unlink(ask, dir_fd=dir_fd)  # a restarted live rank's: its reader is gone
        except FileNotFoundError:
            pass
        os.mkfifo(ask, 0o600, dir_fd=dir_fd)
        # read and write: the FIFO never reads as closed, and a kernel's non-blocking open finds a reader
        ask_fd = os.open(ask, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        if not stat.S_ISFIFO(os.fstat(ask_fd).st_mode):
            os.close(ask_fd)
            raise PermissionError(f"nblaunch: {os.path.join(folder, ask)} was swapped for something else")
        answerer = _Answerer(dir_fd, name, ask_fd, threading.main_thread().ident)
        try:
            answerer.write()  # answer 0: the file exists only once the thread can answer
        except OSError:  # a full disk: the rank runs without stacks (the kernel says it cannot answer)
            os.close(ask_fd)
            os.close(dir_fd)
            return None
    except BaseException:
        os.close(dir_fd)
        raise
    t = threading.Thread(target=answerer.serve, name="nblaunch-stacks", daemon=True)
    t.start()
    return t


class _Answerer:
    def __init__(self, dir_fd: int, name: str, ask_fd: int, main_ident: int):
        self.dir_fd, self.name, self.ask_fd, self.main = dir_fd, name, ask_fd, main_ident
        self.answers = 0
        self.tmp = f"{name}.{os.getpid()}.tmp"

    def serve(self) -> None:
        while True:
            try:
                if not os.read(self.ask_fd, 4096):  # every request waiting is answered by one dump
                    return
            except OSError:
                return
            self.answers += 1
            try:
                self.write()
            except OSError:  # a full disk, or the run folder gone: the kernel says the rank did not answer
                pass

    def write(self) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(self.tmp, flags, 0o600, dir_fd=self.dir_fd)
        try:
            text = header(self.main, self.answers)
            if self.answers:
                frames = sys._current_frames()  # taken under the interpreter's thread-list lock
                text += dump(frames, threading.get_ident())
                text += DETAIL + json.dumps(main_detail(frames.get(self.main))) + "\n"
                del frames
            os.write(fd, text.encode(errors="replace"))
        finally:
            os.close(fd)
        os.replace(self.tmp, self.name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)


def dump(frames: dict, current: int) -> str:
    """Every thread's stack in faulthandler's text (``launch/rank_stacks.py`` parses it), innermost frame first,
    at most ``MAX_DEPTH`` frames a thread; ``current`` is the answering thread ('Current thread')."""
    out = []
    for ident, frame in frames.items():
        out.append(f"{'Current thread' if ident == current else 'Thread'} 0x{ident:016x} (most recent call first):\n")
        depth = 0
        while frame is not None:
            if depth == MAX_DEPTH:
                out.append("  ...\n")
                break
            code, lineno = frame.f_code, frame.f_lineno
            line = "???" if lineno is None else lineno
            out.append(f'  File "{code.co_filename}", line {line} in {code.co_name}\n')
            frame, depth = frame.f_back, depth + 1
        out.append("\n")
    return "".join(out)


def main_detail(frame) -> dict:
    """What the stack's text lacks about the main thread (``frame``, its innermost): the source line of its
    innermost frame of the user's code, and the function that line calls when it is the innermost frame
    (``sleep``: C has no frame)."""
    innermost = frame
    while frame is not None:
        path = frame.f_code.co_filename
        if not (is_nblaunch_file(path) or any(p in path for p in ("/torch/", "-packages/", "/lib/python"))):
            source = source_line(path, frame.f_lineno)
            calling = calling_of(frame) if frame is innermost else None
            return {"source": source, "calling": calling}
        frame = frame.f_back
    return {"source": "", "calling": None}
