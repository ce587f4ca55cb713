"""■ at fixed moments of a run, once or as a storm, and what the notebook is left with.

``storm(kernel, code, at_s, presses)`` runs ``code`` in a real kernel and interrupts it the way
JupyterLab's ■ does (``interrupt_kernel``: SIGINT to the kernel's process group), ``presses`` times
within a second, the first ``at_s`` seconds after a mark of the cell: the kernel starting its code
(``started``), the run's display appearing (``shown_widget``) or a rank printing a text (``printed``).
``aftermath(kernel)`` then says what a user would trip over: locks of the kernel's
left held (logging's, the import lock, nblaunch's launch lock), processes left behind (ranks, the
forkserver template's children), and ``shown_internals(cell)`` which frames of nblaunch, ipywidgets,
``threading`` or ``logging`` the cell showed.

Example::

    >>> cell, ended_s = storm(kernel, "notebook_launcher(f, num_processes=2)", at_s=0.02, presses=5)  # doctest: +SKIP
    >>> cell.error["ename"], shown_internals(cell), aftermath(kernel)                                   # doctest: +SKIP
    ('KeyboardInterrupt', [], {})
"""

from __future__ import annotations

import json
import threading
import time

STORM_SPAN_S = 1.0  # five presses within a second, as a person hammering ■ does
# What a user must never see of nblaunch's plumbing or of the libraries under it.
INTERNALS = (
    "kernelside/",
    "ipywidgets/",
    "threading.py",
    "logging/__init__.py",
    "Exception ignored in",
    "Exception in thread",
)

# Run in the kernel after the storm: each lock tried from another thread (a lock the main thread left held
# is held for every other thread; the main thread itself could take an RLock it holds again).
AFTERMATH = r"""
import json as _j, logging as _l, threading as _t, _imp, sys as _s
def _free(lock):
    got = []
    def _try():
        if lock.acquire(timeout=1.0):
            lock.release()  # (an RLock is released by the thread that took it)
            got.append(True)
    th = _t.Thread(target=_try)
    th.start(); th.join()
    return bool(got)
_held = []
if not _free(_l._lock):
    _held.append("logging's module lock")
for _h in [*_l.getLogger().handlers, *[h for lg in list(_l.Logger.manager.loggerDict.values())
                                      for h in getattr(lg, "handlers", ())]]:
    if _h.lock is not None and not _free(_h.lock):
        _held.append(f"the lock of logging handler {_h!r}")
_w = _s.modules.get("kernelside.engines.warmup")
if _w is not None and _w.WARMUP.thread is not None:
    _w.WARMUP.thread.join(60)  # the warm-up's imports go on, whole, after a ■: they hold import locks meanwhile
import time as _time
_until = _time.monotonic() + 1.0
while _imp.lock_held() and _time.monotonic() < _until:
    _time.sleep(0.01)
if _imp.lock_held():
    _held.append("the import lock")
_r = _s.modules.get("kernelside.launch.runner")
if _r is not None and not _free(_r.KERNEL_LAUNCHES.lock):
    _held.append("nblaunch's launch lock")
print("AFTERMATH " + _j.dumps(_held))
"""


def started(kind, content) -> bool:
    """The mark of the moment the kernel starts the cell's code (IOPub ``execute_input``)."""
    return kind == "execute_input"


def printed(text):
    """The mark of the first output of the cell (a rank's, through nblaunch) that contains ``text``."""
    return lambda kind, content: kind == "stream" and text in content.get("text", "")


def shown_widget(kind, content) -> bool:
    """The mark of the run's display appearing (a launch's status line shows once its ranks exist)."""
    return kind == "display_data"


def storm(kernel, code: str, *, at_s: float = 0.0, presses: int = 5, trigger=started, timeout: float = 120):
    """Run ``code``; press ■ ``presses`` times within ``STORM_SPAN_S``, the first ``at_s`` s after the first IOPub
    message of the cell that ``trigger(kind, content)`` accepts (default: the kernel starting the cell's code).
    Returns the cell and the seconds from the first press to the cell's end."""
    pressed: list[float] = []
    fire = threading.Event()
    done = threading.Event()

    def presser():
        if not fire.wait(timeout) or done.is_set():
            return  # the mark never came: nothing is pressed (and the assert below says so)
        if at_s and done.wait(at_s):  # a fixed offset from the mark (the cell ending first: no press)
            return
        gap = STORM_SPAN_S / max(1, presses)
        for i in range(presses):
            if i and done.wait(gap):
                break  # the cell has ended: later presses would land in the next cell
            pressed.append(time.monotonic())
            kernel.interrupt()

    def on_message(kind, content):
        if trigger(kind, content):
            fire.set()

    thread = threading.Thread(target=presser, daemon=True)
    thread.start()
    from kernel import Cell

    cell = Cell()
    cell.msg_id = kernel.kc.execute(code)
    try:
        kernel.wait(cell, timeout, on_message=on_message)
    finally:
        done.set()
        fire.set()
        thread.join()
    ended = time.monotonic()
    assert pressed, f"■ was never pressed: {cell.outputs}"
    return cell, ended - pressed[0]


def shown(cell) -> str:
    """Everything the cell showed, as text (streams, the error's traceback, rich output's plain text)."""
    parts = []
    for kind, content in cell.outputs:
        if kind == "stream":
            parts.append(content["text"])
        elif kind == "error":
            parts.extend(content.get("traceback", []))
            parts.append(content.get("evalue", ""))
        elif "data" in content:
            parts.append(content["data"].get("text/plain", ""))
    return "\n".join(parts)


def shown_internals(cell) -> list[str]:
    text = shown(cell)
    return [marker for marker in INTERNALS if marker in text]


def aftermath(kernel) -> list[str]:
    """The kernel's locks left held after the storm (an empty list: none)."""
    out = kernel.run(AFTERMATH, timeout=60).ok().stdout
    return json.loads(out.split("AFTERMATH ", 1)[1])


def left_behind(kernel) -> list[str]:
    """Processes of the kernel's that a launch left (ranks, or children of the forkserver template)."""
    import psutil

    procs = kernel.children()
    template = kernel.template_pid()
    if template is not None:
        procs += psutil.Process(template).children(recursive=True)
    out = []
    for p in procs:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                out.append(f"pid {p.pid}: {' '.join(p.cmdline())[:80]}")
        except psutil.NoSuchProcess:
            pass
    return out
