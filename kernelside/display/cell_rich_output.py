"""Kernel side of rank 0's rich output: publish its mime bundles in the cell, within the output budget.

Each ``display`` event from rank 0 (``rank_display.py``) becomes a ``display_data``,
``update_display_data`` or ``clear_output`` message of the running cell — so it is stored in the
notebook like any output — once the text rank 0 printed before it is out (``engines.local_bridge``).
Bundles spend the same budget as text (``RankOutputRouter.spend``): a new display over the budget
is left out and counted (one note at the end says how many); an update over it is kept, newest
per display id, and published when the budget allows or when the run ends, so a live table
(transformers' notebook callback) always ends in its final state.

Where no Jupyter shell runs the launch (plain Python, a terminal), the bundle's text is printed.

Example::

    >>> out = CellRichOutput(router)                                   # doctest: +SKIP
    >>> out.handle({"op": "display", "data": {"text/html": "<b>hi</b>", "text/plain": "hi"},
    ...             "metadata": {}, "transient": {}})
"""

from __future__ import annotations

import json
import math
import sys


def _shell():
    mod = sys.modules.get("IPython.core.interactiveshell")
    if mod is None or not mod.InteractiveShell.initialized():
        return None
    return mod.InteractiveShell.instance()


def bundle_size(data: dict) -> int:
    """Bytes a bundle adds to the notebook (what the budget is spent on)."""
    size = 0
    for value in data.values():
        if isinstance(value, (str, bytes)):
            size += len(value)
        else:
            size += len(json.dumps(value, default=str))
    return size


class CellRichOutput:
    """Publishes rank 0's display events in the cell of the launch."""

    def __init__(self, router):
        self.router = router
        self.deferred: dict[str, dict] = {}  # display id -> newest update over the budget
        self.left_out = 0
        self.unshown_ids: set[str] = set()  # displays left out: their next update is published as the display
        self.published = 0

    def handle(self, payload: dict) -> None:
        if not self.router.shown(0):
            return  # output="none": rank 0's rich output stays out of the cell like its text
        op = payload.get("op")
        if op == "clear":
            self.out_text_first()
            shell = _shell()
            if shell is not None:
                shell.display_pub.clear_output(wait=bool(payload.get("wait")))
            self.deferred.clear()
            return
        display_id = (payload.get("transient") or {}).get("display_id")
        if op == "update" and display_id is not None:
            self.deferred.pop(display_id, None)
            if not self.router.spend(bundle_size(payload["data"])):
                self.deferred[display_id] = payload
                return
        elif not self.router.spend(bundle_size(payload.get("data", {}))):
            self.left_out += 1
            if display_id is not None:
                self.unshown_ids.add(display_id)
            return
        self._publish(payload)

    def tick(self) -> None:
        """Publish held-back updates the budget has room for again."""
        for display_id, payload in list(self.deferred.items()):
            if not self.router.spend(bundle_size(payload["data"])):
                return
            del self.deferred[display_id]
            self._publish(payload)

    def finish(self) -> None:
        """At the end of the run: every display shows its last state; say what was left out."""
        for payload in self.deferred.values():
            self._publish(payload)
        self.deferred.clear()
        if self.left_out:
            self.router.sinks["stdout"].write(
                f"[nblaunch: {self.left_out} rich output(s) of rank 0 (display(), figures) not shown here: "
                "the cell's output budget was spent]\n"
            )
            self.left_out = 0

    def out_text_first(self) -> None:
        self.router.flush_stale(now=math.inf)  # a partial line printed before the display goes first
        for sink in self.router.sinks.values():
            try:
                sink.flush()
            except Exception:
                pass

    def _publish(self, payload: dict) -> None:
        self.out_text_first()
        data, metadata = payload.get("data", {}), payload.get("metadata") or {}
        transient = payload.get("transient") or {}
        update = payload.get("op") == "update"
        if update and transient.get("display_id") in self.unshown_ids:  # the frontend never got the display
            self.unshown_ids.discard(transient["display_id"])
            self.left_out -= 1
            update = False
        shell = _shell()
        self.published += 1
        if shell is None:
            text = data.get("text/plain")
            if text and not update:
                self.router.sinks["stdout"].write(text.rstrip("\n") + "\n")
            return
        kwargs = {"transient": transient} if transient else {}
        shell.display_pub.publish(data=data, metadata=metadata, update=update, **kwargs)
