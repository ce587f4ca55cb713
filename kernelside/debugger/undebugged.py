"""Ranks start untouched by the kernel's debugger.

With JupyterLab's debugger switched on, the kernel runs debugpy (pydevd), which patches ``os.fork`` and
the subprocess functions so that every child Python process connects back to the debug adapter and
waits there until a debugger client attaches to it (DAP ``debugpyAttach``). JupyterLab never attaches
to those, so a forked rank would wait forever and a spawned one would start inside pydevd. Ranks are
nblaunch's processes, debugged (when at all) through nblaunch: while they start, pydevd's own
"skip the patching" switch is on, so a forked rank drops the kernel's debugger at once (pydevd clears
it in the child and puts ``sys.settrace`` back) and a spawned one starts as a plain interpreter.

With the debugger off nothing happens here: pydevd is imported with ipykernel but has patched nothing,
and a rank imports nothing of it.

Example::

    with ranks_start_undebugged():
        pid = os.fork()        # the child runs without the kernel's debugger
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import threading


@contextlib.contextmanager
def ranks_start_undebugged():
    """Processes started in this thread meanwhile are not joined to the kernel's debugger (see above).
    Nested uses are one: only the outermost switches pydevd's patching off and on again."""
    monkey = sys.modules.get("_pydev_bundle.pydev_monkey")
    applying = getattr(monkey, "_get_apply_arg_patching", None)
    skip = getattr(monkey, "skip_subprocess_arg_patch", None)
    if applying is None or skip is None or not applying():
        yield
        return
    with skip():
        yield


def drop_inherited_tracer() -> None:
    """In a forked rank: no trace function of the kernel's debugger is left on this thread's frames.

    pydevd's fork hook clears its debugger in the child, but the frames the child was forked in (the
    kernel's, down to the fork) keep the tracer they had; without the debugger it does nothing but cost."""
    if sys.gettrace() is None:
        return
    sys.settrace(None)
    frame = sys._getframe()
    while frame is not None:
        frame.f_trace = None
        frame = frame.f_back


def undebugged(thread: threading.Thread) -> threading.Thread:
    """``thread`` (one of nblaunch's own, not yet started) is never traced or stopped by the kernel's debugger.

    It is plumbing (imports ahead of a launch, a rank's reader, an agent): under the debugger's tracing
    torch's imports alone take minutes, and a user's breakpoint must never stop the thread that serves
    the ranks. ``pydev_do_not_trace`` is pydevd's documented mark for such a thread.

    >>> undebugged(threading.Thread(target=print, daemon=True)).start()
    <BLANKLINE>
    """
    thread.pydev_do_not_trace = True
    return thread


def import_undebugged(name: str):
    """Import module ``name`` as ``importlib.import_module`` does, outside the kernel's debugger.

    With the debugger on, the kernel's main thread is traced, and an import as large as torch's takes
    minutes under pydevd's tracer (every new function passes its file filters). The import runs in an
    undebugged thread instead; this thread waits for it (a KeyboardInterrupt still reaches the wait).

    >>> import_undebugged("json").dumps([1])
    '[1]'
    """
    if sys.gettrace() is None or name in sys.modules:
        return importlib.import_module(name)
    done: dict = {}

    def run() -> None:
        try:
            done["module"] = importlib.import_module(name)
        except BaseException as e:  # noqa: B036 - raised again in the waiting thread
            done["error"] = e

    thread = undebugged(threading.Thread(target=run, name="nblaunch-import", daemon=True))
    thread.start()
    while thread.is_alive():
        thread.join(0.1)
    if "error" in done:
        raise done["error"]
    return done["module"]
