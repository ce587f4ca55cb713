"""What the ranks ask of the notebook itself — rank 0's rich output, input prompts — for one launch.

The order of these events with the rank's text is its reader's (``engines.rank_reader``): by the
time an event reaches the bridge, the text written before it has gone to the router. The bridge
publishes rank 0's ``display`` bundles in the cell and relays ``input_request`` prompts through
the kernel's stdin channel, writing the answer back on the rank's replies pipe.

Example::

    >>> bridge = NotebookBridge(recorder)          # in EventLoop.__init__    # doctest: +SKIP
    >>> bridge.on_event(w, "display", payload)
"""

from __future__ import annotations

from ..display.cell_rich_output import CellRichOutput
from ..display.stdin_relay import StdinRelay

EVENT_KINDS = ("display", "input_request")
RANK = 0


class NotebookBridge:
    """Rank 0's rich output and the ranks' prompts for one launch."""

    def __init__(self, recorder, on_wake_fd=None):
        """``on_wake_fd(fd)``: the loop's to watch from the first prompt on; readable when an answer from the
        frontend is ready (the loop then calls ``on_wake()``)."""
        self.rich = CellRichOutput(recorder.router)
        self.rec = recorder
        self.stdin = StdinRelay(show_text=self._show_debugger_text, on_wake_fd=on_wake_fd)

    def on_event(self, w, kind: str, payload: dict) -> None:
        """A ``display`` or ``input_request`` event (the text before it is out already)."""
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
        self.stdin.close()
        self.rich.finish()
