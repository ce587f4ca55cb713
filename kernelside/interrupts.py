"""■ while nblaunch works in the kernel: recorded at once, acted on only where it is safe.

Python runs a SIGINT handler in the main thread between two bytecodes, wherever that thread is: inside
``logging``'s lock, a widget's constructor, ``threading``'s ``join``, the forkserver's half-answered fork.
The default handler raises ``KeyboardInterrupt`` right there; pressed a few times during a launch's
start-up, that left locks held, ranks nobody knew of, and the notebook showing the internals of whatever
it landed in. So while a launch, a live request or a live session's start or stop runs, ``deferred()``
installs a handler that does nothing but count the press and wake the kernel loop (one byte on a pipe its
selector watches): it takes no lock and allocates nothing that another handler could be holding. The
runner raises ``KeyboardInterrupt`` itself, at the points it chose (``check()``), and stops the ranks.

Presses within ``STORM_S`` of the first are one ■ (a person hammering the button): the run is interrupted
once, and the presses that come while the notebook shows the error are not a second interrupt of
IPython's own code. A press after that is a new one (``presses_since``): "stop waiting".

Example::

    >>> with deferred():                  # in the kernel's main thread   # doctest: +SKIP
    ...     start_ranks()                 # a ■ now is only counted
    ...     check()                       # raises KeyboardInterrupt if ■ was pressed
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import threading
import time

from .errors import CellInterrupted

STORM_S = 1.0  # presses this close to the first are the same ■


class InterruptGate:
    """The kernel process's SIGINT while nblaunch works: a counter, a wake-up pipe, the handler it replaced."""

    def __init__(self):
        self.presses = 0  # every SIGINT since the gate was made (the handler's only write, besides the pipe)
        self.acted_on = 0  # presses already turned into a KeyboardInterrupt
        self.first_at: float | None = None  # monotonic: the first press of the current ■
        self.depth = 0
        self.previous = None
        self.wake_r, self.wake_w = -1, -1
        self.drained_at = 0  # ``presses`` when the pipe was last emptied: the handler counts before it writes

    # -- the handler: count and wake, nothing else ------------------------------------------------
    def _on_sigint(self, signum, frame) -> None:
        self.presses += 1
        try:
            os.write(self.wake_w, b"!")
        except OSError:  # a full pipe: the loop is awake already
            pass

    # -- what the runner asks ---------------------------------------------------------------------
    def pending(self) -> bool:
        """A press not acted on yet (presses of a ■ already acted on do not count)."""
        if self.presses <= self.acted_on:
            return False
        if self.first_at is not None and time.monotonic() - self.first_at < STORM_S:
            self.acted_on = self.presses  # the same ■ as the one acted on
            return False
        return True

    def check(self) -> None:
        """Raise ``KeyboardInterrupt`` here if ■ was pressed since the last check. (The kernel loop asks at every
        turn: without a press since the last drain the pipe is empty, and is not read.)"""
        if self.presses != self.drained_at:
            self.drain()
        if self.pending():
            self.acted_on = self.presses
            self.first_at = time.monotonic()
            raise KeyboardInterrupt

    def presses_since(self, count: int) -> int:
        """Presses after ``count`` (``self.presses`` read earlier), not counting the storm of the first."""
        self.pending()  # folds a storm's later presses into the ■ acted on
        return max(0, self.presses - max(count, self.acted_on))

    def drain(self) -> None:
        """Empty the wake-up pipe (the selector watching it would otherwise wake at once, again and again)."""
        self.drained_at = self.presses
        if self.wake_r < 0:
            return
        try:
            while os.read(self.wake_r, 512):
                pass
        except (BlockingIOError, OSError):
            pass

    # -- install, restore -------------------------------------------------------------------------
    def enter(self) -> bool:
        """Install the counting handler (outermost call only). False where signals cannot be handled here: a
        thread other than the main one (■ never lands there anyway)."""
        if threading.current_thread() is not threading.main_thread():
            return False
        if self.depth == 0:
            if self.wake_r < 0:
                self.wake_r, self.wake_w = os.pipe()
                os.set_blocking(self.wake_r, False)
                os.set_blocking(self.wake_w, False)
            current = signal.signal(signal.SIGINT, self._on_sigint)
            # the tail of an earlier interrupt's storm is not needed while counting: keep the handler under it
            self.previous = current.previous if isinstance(current, _QuietTail) else current
            self.presses = self.acted_on = self.drained_at = 0
            self.first_at = None
        self.depth += 1
        return True

    def leave(self, raising: bool) -> bool:
        """Restore the handler (outermost call only). True: a press was not acted on, and the caller raises it
        now, unless an error leaves already (``raising``): ■ is never lost, and never replaces the cell's error.
        After an interrupt, the rest of its storm is swallowed for ``STORM_S`` (``_QuietTail``)."""
        self.depth -= 1
        if self.depth:
            return False
        if self.presses != self.drained_at:
            self.drain()
        unacted = self.pending()
        if unacted and not raising:
            self.acted_on = self.presses
            self.first_at = time.monotonic()
        interrupted = self.first_at is not None
        previous, self.previous = self.previous, None
        if interrupted:
            signal.signal(signal.SIGINT, _QuietTail(previous, self.first_at))
        else:
            signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)
        return unacted and not raising

    def after_fork_in_child(self) -> None:
        """A process forked while the gate is up (a rank): none of this is its. Until its life cycle sets its own
        handlers (after ``setsid``), it ignores SIGINT: a ■ sent to the kernel's process group in the moment
        between the fork and ``setsid`` reaches it too, and must not end it as a made-up failure."""
        if self.depth == 0:
            return  # a fork of the user's, outside nblaunch: its handlers are the kernel's own
        for fd in (self.wake_r, self.wake_w):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.__init__()
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, signal.SIG_IGN)


class _QuietTail:
    """After an interrupt: the presses still coming within ``STORM_S`` of its first are dropped (the notebook is
    showing the error), then the handler that was there before is back and answers the next press. ipykernel puts
    its own handler back at the end of the cell in any case."""

    def __init__(self, previous, first_at: float):
        self.previous, self.first_at = previous, first_at

    def __call__(self, signum, frame) -> None:
        if time.monotonic() - self.first_at < STORM_S:
            return
        previous = self.previous if self.previous is not None else signal.default_int_handler
        signal.signal(signal.SIGINT, previous)
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            raise KeyboardInterrupt


# Global on purpose: a process has one SIGINT handler, and the kernel loop, the runner and the live session
# all read the one count of presses.
GATE = InterruptGate()
os.register_at_fork(after_in_child=GATE.after_fork_in_child)


# What a ■ that no check acted on says as the command ends, per command (a stranger reads these in the cell).
BEFORE_RANKS = "the launch was interrupted (■) before any rank started; nothing is left running."
AS_IT_ENDED = (
    "■ came as the run was ending: every rank had finished, but the cell's result was not kept (run it again). "
    "Nothing is left running."
)
SESSION_NOT_STARTED = "the live session was not started (■); nothing is left running."
SESSION_STOPPED = "■ came while the live session was stopping: it is stopped, and nothing is left running."
SESSION_NOT_RESTARTED = "the live session was not restarted (■): its ranks and their state are as they were."
REQUEST_NOT_SENT = "the request was interrupted (■) before it reached the ranks: every rank kept its state."
PUSHED = "■ came as the values reached the ranks: every rank has them."


@contextlib.contextmanager
def deferred(interrupted: str = BEFORE_RANKS, as_it_ended: str = AS_IT_ENDED):
    """While the block runs, ■ is counted instead of raised (see the module docstring); ``check()`` raises it.

    A bare ``KeyboardInterrupt`` from a ``check()`` leaves the innermost block (which knows what was cut short)
    as a short one saying ``interrupted`` (the runner raises its own, which says where the ranks were, once it
    has stopped them); a press that came too late for any check is raised as the outermost block ends, saying
    ``as_it_ended``.
    """
    installed = GATE.enter()
    raising = False
    try:
        yield GATE
    except CellInterrupted:
        raising = True
        raise
    except KeyboardInterrupt:
        raising = True
        raise CellInterrupted(interrupted) from None
    except BaseException:
        raising = True
        raise
    finally:
        if installed and GATE.leave(raising):
            raise CellInterrupted(as_it_ended) from None


def deferring(interrupted: str = BEFORE_RANKS, as_it_ended: str = AS_IT_ENDED):
    """``deferred()`` around a whole function (a magic, a session's request)."""

    def wrap(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with deferred(interrupted, as_it_ended):
                return fn(*args, **kwargs)

        return wrapper

    return wrap


def check() -> None:
    """Raise ``KeyboardInterrupt`` if ■ was pressed since the last check (a no-op outside ``deferred()``)."""
    if GATE.depth:
        GATE.check()


def wake_fd() -> int | None:
    """The fd that becomes readable at each press while deferred (for a selector to wake on), or None."""
    return GATE.wake_r if GATE.depth and GATE.wake_r >= 0 else None
