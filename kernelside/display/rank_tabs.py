"""``output="all"`` in a notebook: one tab per rank in the cell instead of interleaved ``[rank N]`` lines, lowest
rank first: the ranks the cell runs on (a live cell's ``--ranks``), never an empty tab of a rank left out. Each
tab shows its rank's latest output (its last ``KEEP_CHARS``; the log file has every line), redrawn at most
``REDRAW_S`` apart. The tabs are ipywidgets, so the tab a user picked is stored with the notebook and shown again
when it is reopened.

Example::

    >>> tabs = RankOutputTabs((0, 1))                              # doctest: +SKIP
    >>> tabs.write(1, "stdout", "hello from rank 1\\n"); tabs.tick(force=True)
"""

from __future__ import annotations

import html
import time

KEEP_CHARS = 32 * 1024  # per rank: what a tab holds (the widget's state is saved with the notebook)
REDRAW_S = 0.5  # with KEEP_CHARS: a flood of 8 ranks sends at most 0.5 MB/s, under the IOPub limit
_PRE = (
    '<pre style="margin: 0; max-height: 24em; overflow: auto; white-space: pre-wrap; '
    'font: var(--jp-code-font-size, 13px) var(--jp-code-font-family, monospace)">'
)


class RankOutputTabs:
    """A Tab widget with each rank's output; ``write`` is called by the output router, ``tick`` by the loop."""

    def __init__(self, ranks):
        """``ranks``: the ranks the cell runs on, a tab each, in this order."""
        import ipywidgets as w

        ranks = sorted(ranks)
        self.texts = dict.fromkeys(ranks, "")
        self.cut = dict.fromkeys(ranks, False)  # older output of the rank was dropped from its tab (it is in the log)
        self.dirty: set[int] = set()
        self.pages = {r: w.HTML(value=_PRE + "</pre>") for r in ranks}
        self.widget = w.Tab(children=list(self.pages.values()), selected_index=0, layout=w.Layout(width="100%"))
        self.widget.add_class("nblaunch-rank-tabs")
        for page in self.pages.values():
            page.add_class("nblaunch-rank-page")
        for i, r in enumerate(ranks):
            self.widget.set_title(i, f"rank {r}")
        self.last_draw = 0.0

    def show(self) -> None:
        from IPython.display import display

        display(self.widget)

    def write(self, rank: int, stream: str, text: str) -> None:
        if rank not in self.texts:
            return  # (a rank the cell does not run on prints nothing for it)
        piece = html.escape(text)
        if stream == "stderr":
            piece = f'<span style="color: var(--jp-error-color1, #c00)">{piece}</span>'
        joined = self.texts[rank] + piece
        if len(joined) > KEEP_CHARS:
            joined = joined[joined.find("\n", len(joined) - KEEP_CHARS) + 1 :]  # whole lines only
            self.cut[rank] = True
        self.texts[rank] = joined
        self.dirty.add(rank)

    def tick(self, force: bool = False) -> None:
        now = time.monotonic()
        if not self.dirty or (not force and now - self.last_draw < REDRAW_S):
            return
        self.last_draw = now
        for rank in sorted(self.dirty):
            note = "<i>(earlier lines: in the rank's log file)</i>\n" if self.cut[rank] else ""
            self.pages[rank].value = f"{_PRE}{note}{self.texts[rank]}</pre>"
        self.dirty.clear()


def make_rank_tabs(ranks, output: str, widgets: bool) -> RankOutputTabs | None:
    """Tabs for ``output="all"`` over ``ranks`` (those the cell runs on) where widgets render and more than one rank
    runs it; None otherwise (lines stay ``[rank N]``-prefixed: one rank's need no tab to tell them apart)."""
    return RankOutputTabs(ranks) if widgets and output == "all" and len(ranks) > 1 else None
