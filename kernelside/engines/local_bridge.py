"""What rank 0 asks of the notebook itself — rich output and input prompts — in order with its text.

Rank 0's text arrives on its stdout/stderr pipes, its ``display`` and ``input_request`` events on
its event pipe, and the kernel loop reads whichever is ready first. Each such event carries how
many bytes rank 0 had written to each stream when it was sent (``rank_streams.positions()``), so:

- when an event arrives, the text before it is read first — exactly up to its position, from what
  the loop already read or straight from the pipe, where the rank flushed it before sending — and
  only then is the bundle published or the question asked;
- when text arrives, the event pipe is read first: an event sent before some of these bytes were
  written is already there, and takes its place inside them.

Nothing waits: the text an event needs was written before the event, so it is in the pipe. Other
ranks' output goes straight to the router.

Example::

    >>> bridge = NotebookBridge(loop, recorder)    # in EventLoop.__init__    # doctest: +SKIP
    >>> bridge.text(w, "stdout", data)             # instead of recorder.output for rank 0
    >>> bridge.on_event(w, "display", payload)
"""

from __future__ import annotations

import os

from ..display.cell_rich_output import CellRichOutput
from ..display.stdin_relay import StdinRelay

EVENT_KINDS = ("display", "input_request")
STREAMS = ("stdout", "stderr")
RANK = 0


class NotebookBridge:
    """Rank 0's rich output and prompts for one launch, ordered with its text."""

    def __init__(self, loop, recorder):
        self.loop = loop
        self.rec = recorder
        self.rich = CellRichOutput(recorder.router)
        self.stdin = StdinRelay(show_text=self._show_debugger_text)
        self.unfed = {s: bytearray() for s in STREAMS}  # read from rank 0's pipes, not yet given to the router
        self.fed = dict.fromkeys(STREAMS, 0)  # bytes of rank 0's streams given to the router

    @property
    def wake_fd(self) -> int:
        """Readable when an answer from the frontend is ready: the loop then calls ``on_wake()``."""
        return self.stdin.wake_fd

    def text(self, w, stream: str, data: bytes) -> None:
        """(instead of ``recorder.output``) Bytes a rank wrote on ``stream``."""
        if w.rank != RANK:
            self.rec.output(w.rank, stream, data)
            return
        self.unfed[stream] += data
        self.loop.read_pending_events(w)  # events sent before some of these bytes take their place in them
        self._feed(stream, len(self.unfed[stream]))

    def on_event(self, w, kind: str, payload: dict) -> None:
        """A ``display`` or ``input_request`` event: text before it first, then the event."""
        if w.rank == RANK:
            for stream in STREAMS:
                self._catch_up(w, stream, (payload.get("pos") or {}).get(stream, 0))
        if kind == "display":
            if w.rank == RANK:
                self.rich.handle(payload)
        elif kind == "input_request":
            self.rich.out_text_first()
            self.stdin.ask(w.pipes.replies_w, payload)

    def on_wake(self) -> None:
        self.stdin.on_wake()

    def _show_debugger_text(self, text: str) -> None:
        """(the stdin relay's thread) A rank's debugger text, in the cell just before its prompt."""
        sink = self.rec.router.sinks["stdout"] if self.rec.router is not None else None
        if sink is not None:
            sink.write(text if text.endswith("\n") else text + "\n")
            sink.flush()

    def tick(self) -> None:
        self.rich.tick()

    def close(self) -> None:
        """The run is over (every pipe drained): last states of displays, and no question left open."""
        for stream in STREAMS:
            self._feed(stream, len(self.unfed[stream]))
        self.stdin.close()
        self.rich.finish()

    def _catch_up(self, w, stream: str, position: int) -> None:
        """Give the recorder rank 0's ``stream`` up to ``position``: from what was read, then from the pipe."""
        need = position - self.fed[stream]
        if need <= 0:
            return
        self._feed(stream, min(need, len(self.unfed[stream])))
        need = position - self.fed[stream]
        fd = w.pipes.stdout_r if stream == "stdout" else w.pipes.stderr_r
        while need > 0 and fd in self.loop.sel.get_map():
            try:
                data = os.read(fd, min(need, 1 << 20))  # exactly what is missing: later bytes stay in the pipe
            except BlockingIOError:
                return  # bytes written past Python's streams (os.write on fd 1): nothing more to wait for
            except OSError:
                return
            if not data:
                return
            self.rec.output(RANK, stream, data)
            self.fed[stream] += len(data)
            need -= len(data)

    def _feed(self, stream: str, n: int) -> None:
        if n <= 0:
            return
        buf = self.unfed[stream]
        chunk = bytes(buf[:n])
        del buf[:n]
        self.rec.output(RANK, stream, chunk)
        self.fed[stream] += n
