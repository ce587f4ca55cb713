"""A rank's answer to "where are you?": every thread's Python stack, written by a thread of its own.

``install(path)`` makes, in the rank's run folder (by the folder's descriptor, owner-only):

- ``rank<N>.stacks.ask``, a FIFO the kernel writes a byte into to ask (``launch/rank_stacks.py``);
- ``rank<N>.stacks``, the latest answer: a first line ``nblaunch-stacks main=0x<id> answer=<n>`` (which
  thread is the rank's main thread, and how many answers it has given), then ``faulthandler``'s text.

A daemon thread, ``nblaunch-stacks``, waits on the FIFO and writes each answer under a temporary name,
renamed over ``rank<N>.stacks`` when whole: the kernel reads only finished answers. There is no signal
handler: an earlier version dumped from a handler for a process-directed signal, which any thread could
take (gloo's own threads included) and which then walked the other threads' frames while they ran:
under concurrent requests during ``all_reduce`` that crashed ranks with SIGSEGV. Here the dump runs in
a Python thread holding the GIL, when every other thread's frames are still; a main thread blocked in
a collective has released the GIL, so the rank still answers at once. Requests that arrive while an
answer is written are answered by that one (the FIFO's bytes are read together).

Example::

    >>> install(stacks_path(run_dir, 0))      # doctest: +SKIP  (start_rank does this)
"""

from __future__ import annotations

import faulthandler
import json
import os
import re
import stat
import sys
import threading

from ..run_contract import rank_stacks_name
from ..short_traceback import is_nblaunch_file
from .call_site import callee_of_line, calling_of, source_line

DETAIL = "nblaunch-detail "  # last line of an answer: the main thread's source line and the C function it calls
HEADER = "nblaunch-stacks main=0x"  # first line of a rank's answer: which thread is its main thread, and its count
ASK_SUFFIX = ".ask"  # rank<N>.stacks.ask: the FIFO a request is written into
_THREAD = re.compile(r"^(?:Current thread|Thread) 0x([0-9a-fA-F]+)")  # faulthandler's line before each thread
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in ')
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
        flags = os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(self.tmp, flags, 0o600, dir_fd=self.dir_fd)
        try:
            start = os.write(fd, header(self.main, self.answers).encode())
            if self.answers:
                faulthandler.dump_traceback(fd, all_threads=True)  # the GIL is held: every other thread is still
                dump = os.pread(fd, os.lseek(fd, 0, os.SEEK_CUR) - start, start).decode(errors="replace")
                os.write(fd, (DETAIL + json.dumps(main_detail(dump, self.main)) + "\n").encode())
        finally:
            os.close(fd)
        os.replace(self.tmp, self.name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)


def main_detail(dump: str, main_ident: int) -> dict:
    """What faulthandler's text (``dump``) lacks about the main thread: the source line of its innermost frame of
    the user's code, and the function that line calls when it is the innermost frame (``sleep``: C has no frame).
    Read from the text and ``linecache``: the main thread's frames are not walked from here (``f_back`` of
    another thread's running frames crashed ranks with SIGSEGV under 8,000 asks)."""
    frames, inside = [], False
    for line in dump.splitlines():
        thread = _THREAD.match(line)
        if thread:
            inside = int(thread.group(1), 16) == main_ident
        elif inside and (m := _FRAME.match(line)):
            frames.append((m.group(1), int(m.group(2))))
    for i, (path, lineno) in enumerate(frames):  # innermost first
        if not (is_nblaunch_file(path) or any(p in path for p in ("/torch/", "-packages/", "/lib/python"))):
            source = source_line(path, lineno)
            return {"source": source, "calling": _calling(main_ident, path, lineno, source) if i == 0 else None}
    return {"source": "", "calling": None}


def _calling(main_ident: int, path: str, lineno: int, source: str) -> str | None:
    """The callee of the main thread's innermost frame, still at ``path:lineno``: read from that one frame's code
    and instruction offset (``call_site.calling_of``; no ``f_back``), else from the line's text alone."""
    frame = sys._current_frames().get(main_ident)
    if frame is not None and frame.f_code.co_filename == path and frame.f_lineno == lineno:
        return calling_of(frame)
    return callee_of_line(source)
