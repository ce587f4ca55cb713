"""A rank's standard streams: fds 1/2 as its stdout/stderr, and nothing left pointing at the kernel.

Example::

    >>> fresh_std_streams()      # first thing in a forked rank   # doctest: +SKIP
"""

from __future__ import annotations

import os
import sys

from . import output_positions, rank_display, rank_identity
from .output_positions import libc


def fresh_std_streams() -> None:
    """New sys.stdout/sys.stderr on fds 1/2, line-buffered, and old stream objects redirected.

    Libraries keep references to the kernel's stream objects (a logging handler made in an
    earlier cell, say); pointing their write/flush at the new streams keeps that output on
    this worker's pipes instead of the kernel's ZMQ sockets.
    """
    kernel_streams = (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)
    out, err = output_positions.std_streams()
    for stream, new in zip(kernel_streams, (out, err, out, err), strict=True):
        if stream is None:
            continue
        try:
            stream.write = new.write
            stream.flush = new.flush
        except (AttributeError, TypeError):
            pass  # builtin TextIOWrapper objects cannot be patched; they already write to fds 1/2
    sys.stdout, sys.stderr = out, err
    sys.__stdout__, sys.__stderr__ = out, err
    sys.stdin = open(os.devnull)
    enable_faulthandler()


def enable_faulthandler() -> None:
    # A crash (SIGSEGV, SIGBUS, ...) then leaves its Python stack in this rank's own output,
    # where the error summary shows it, instead of on whatever fd the kernel had chosen.
    import faulthandler

    faulthandler.enable(file=sys.stderr, all_threads=True)


def forget_kernel_shell() -> None:
    """The inherited IPython shell talks to the kernel's ZMQ sockets, which belong to the kernel
    process: without it, get_ipython() is None here and display()/tqdm.auto fall back safely."""
    mod = sys.modules.get("IPython.core.interactiveshell")
    if mod is not None:
        shell = mod.InteractiveShell._instance
        rank_display.keep_kernel_formatter(shell)  # the notebook's formatters, for rank 0's display()
        rank_identity.leave_kernel_shell(shell)  # builtins and notebook names that lead back to the shell
        mod.InteractiveShell.clear_instance()


def flush_all() -> None:
    for s in (sys.stdout, sys.stderr):
        try:
            s.flush()
        except Exception:
            pass
    c = libc()
    if c is not None:
        c.fflush(None)  # C-level stdio buffers (printf from extensions)
