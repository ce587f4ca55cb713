"""The kernel side of progress: widgets for bars, a live metrics chart, and the run's status line.

``RunDisplay`` receives the workers' ``progress`` and ``metrics`` events from the engine's
loop and redraws at most every ``REDRAW_S`` (bars) / ``CHART_S`` (chart) — whatever rate
the workers send at. All widgets are plain ipywidgets (the chart is an SVG in an HTML
widget), so a saved notebook with widget state shows the final bars and chart again.

``make_run_display()`` returns None where widgets cannot render (a terminal IPython, no
ipywidgets, ``output="none"``); workers then draw tqdm text bars on stderr instead.
"""

from __future__ import annotations

import html
import time

from tqdm import std as tqdm_std

from ..kernel_shell import running_shell
from ..run_contract import RankState, RunState
from ..short_traceback import first_line
from .metrics_chart import MetricsChart
from .run_links import log_links_html, run_link_html, run_name

REDRAW_S = 0.1
CHART_S = 0.5


def widgets_can_render() -> bool:
    """True inside a Jupyter kernel (not terminal IPython) with ipywidgets installed."""
    shell = running_shell()
    if shell is None or getattr(shell, "kernel", None) is None:
        return False
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    return True


def render_mode(output: str) -> str:
    """What workers should do with progress: 'widgets', 'text' or 'off'."""
    if output == "none":
        return "text"  # text bars then land in the log files only
    return "widgets" if widgets_can_render() else "text"


def _fmt_time(s: float | None) -> str:
    if s is None or s != s or s == float("inf"):
        return "?"
    return tqdm_std.tqdm.format_interval(s)


def fmt_elapsed(s: float) -> str:
    """A run's duration as a person reads it: '0.42 s', '7.3 s', '48 s', then tqdm's '01:05'."""
    if s < 1:
        return f"{s:.2f} s"
    if s < 10:
        return f"{s:.1f} s"
    if s < 60:
        return f"{s:.0f} s"
    return _fmt_time(s)


# What the status line says of a run that ended without its value: one word; the error box below says the rest.
# how the status line says a run ended, by its state (any other: the outcome's own word)
ENDED = {RunState.TIMEOUT: "timed out", RunState.INTERRUPTED: "interrupted (■)"}


IDLE_NOTE = (
    '<span class="nblaunch-idle-note" style="color: var(--jp-ui-font-color2, #666)">'
    "The status bar may say Idle during a kernel's first widget cell: this cell is running.</span>"
)


def _widgets_before(w) -> bool:
    """Whether this kernel has made an ipywidgets widget before (ipywidgets 8 keeps them in ``_instances``)."""
    instances = getattr(getattr(getattr(w, "widgets", None), "widget", None), "_instances", None)
    return True if instances is None else bool(instances)


def bar_text(state: dict) -> str:
    """' 37% 37/100 [00:03<00:05, 12.10it/s, loss=0.3]' from a progress event: tqdm's own meter, without the bar."""
    return tqdm_std.tqdm.format_meter(
        state["n"],
        state["total"],
        state["elapsed"],
        ncols=0,
        unit=state["unit"],
        unit_scale=state.get("unit_scale") or False,
        rate=state["rate"],
        postfix=state["postfix"] or None,
    ).strip()


class RunDisplay:
    """Status line + progress bars + metrics chart for one launch, in the cell that started it."""

    def __init__(self, report, scope: str):
        import ipywidgets as w

        self.w = w
        self.report = report
        self.scope = scope
        # The kernel's first widget: JupyterLab 4.4+ opens a kernel subshell for its comm, and its status bar
        # reads Idle for the rest of this cell (later cells read Busy). The kernel cannot change that: the
        # status line says so while the cell runs (docs/guide/output.md).
        self.first_widget = not _widgets_before(w)
        self.status = w.HTML(value="")
        self.bars_box = w.VBox([])
        self.chart = w.HTML(value="", layout=w.Layout(width="100%"))  # the chart follows the cell's width
        self.metrics_chart = MetricsChart()  # reads only the points that arrived since the last redraw
        self.box = w.VBox([self.status, self.bars_box, self.chart])
        # (the launch panel's stylesheet marks a reopened notebook's stale widgets once, on the status line)
        for widget, cls in (
            (self.box, "nblaunch-run-box"),
            (self.bars_box, "nblaunch-bars"),
            (self.chart, "nblaunch-chart-box"),
        ):
            widget.add_class(cls)
        self.bars: dict[tuple[int, int], dict] = {}  # (rank, bar id) -> {"state", "widget", "dirty"}
        self.dirty = False
        self.chart_dirty = False
        self.t0 = time.monotonic()
        self.last_draw = 0.0
        self.last_chart = 0.0
        self.spare: list = []  # widgets of finished leave=False bars, ready for the next bar
        self.ended: str | None = None  # set once the run is over: what the status line says instead of counts
        self.elapsed: float | None = None  # frozen when the run ends
        self.detail = ""  # a failed run's root cause, in one line

    def hold(self, widget) -> bool:
        """Show ``widget`` (the ``--output all`` rank tabs) under the bars, above the chart: the printed lines
        stay in view while the cell runs, not pushed below a chart at a 720 px screen's bottom."""
        self.box.children = (self.status, self.bars_box, widget, self.chart)
        return True

    def show(self) -> None:
        from IPython.display import display

        self._draw_status()
        display(self.box)

    # -- events from the engine loop ---------------------------------------------------
    def on_event(self, rank: int, kind: str, payload) -> None:
        if kind == "progress":
            key = (rank, payload["id"])
            entry = self.bars.get(key)
            if entry is None:
                entry = self.bars[key] = {"state": payload, "widget": self._new_bar(rank, payload)}
                self._relayout()
            entry["state"] = payload
            entry["dirty"] = True
            self.dirty = True
            if payload["closed"]:
                self._update_bar(entry)  # the final state is always drawn, never throttled away
                if not payload["leave"]:
                    self.spare.append(self.bars.pop(key)["widget"])
                    self._relayout()
        elif kind == "metrics":
            self.chart_dirty = True

    def tick(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self.last_draw >= REDRAW_S:
            self.last_draw = now
            if self.dirty or force:
                for entry in self.bars.values():
                    if entry.get("dirty"):
                        self._update_bar(entry)
                self.dirty = False
            self._draw_status()
        if self.chart_dirty and (force or now - self.last_chart >= CHART_S):
            self.last_chart = now
            self.chart_dirty = False
            self.chart.value = self.metrics_chart.render(self.report.metrics)

    def finish(self, error: BaseException | None) -> None:
        self.tick(force=True)
        if self.report.metrics:  # the final chart, with its smoothing control (see MetricsChart.render)
            self.chart.value = self.metrics_chart.render(self.report.metrics, final=True)
        for box in self.spare:  # hidden and never shown again: free their models in the kernel and page
            for widget in (*box.children, box):
                widget.close()
        self.spare.clear()
        for entry in self.bars.values():
            st = entry["state"]
            if error is not None and not st["closed"]:
                entry["widget"].children[0].bar_style = "danger"
        self.elapsed = time.monotonic() - self.t0
        self.first_widget = False  # the cell is over: the note on the status bar's Idle goes with it
        if error is not None:
            self.ended = ENDED.get(self.report.state, self.report.outcome)
            if self.report.state is RunState.FAILED:  # which rank and why, in one line (the error box has the rest)
                self.detail = first_line(error).removeprefix("nblaunch: ") or type(error).__name__
        self._draw_status()

    def session_ended(self, text: str) -> None:
        """A live session's start cell, when the session stops: its status line says so instead of 'N ready'."""
        self.ended = text
        self._draw_status()

    # -- drawing -------------------------------------------------------------------------
    def _new_bar(self, rank: int, st: dict):
        w = self.w
        label = st["desc"] or ""
        if self.scope == "all":
            label = f"[rank {rank}] {label}"
        if self.spare:  # a finished leave=False bar's widgets: an inner loop reuses one pair, not N
            box = self.spare.pop()
            bar, text = box.children
            bar.description, bar.max, bar.value, bar.bar_style = label, float(st["total"] or 1), 0.0, ""
            bar.layout.margin = f"0 0 0 {2 * st['depth']}em"
            text.value = ""
            return box
        bar = w.FloatProgress(
            value=0.0,
            min=0.0,
            max=float(st["total"] or 1),
            description=label,
            style={"description_width": "initial"},
            layout=w.Layout(width="50%", margin=f"0 0 0 {2 * st['depth']}em"),
        )
        return w.HBox([bar, w.HTML(value="")])

    def _update_bar(self, entry: dict) -> None:
        st, box = entry["state"], entry["widget"]
        bar, text = box.children
        if st["total"]:
            bar.max = float(st["total"])
            bar.value = float(min(st["n"], st["total"]))
        else:  # unknown length: a full bar that shows activity
            bar.max, bar.value = 1.0, 1.0
        if st["closed"]:
            bar.bar_style = "success" if not st["total"] or st["n"] >= st["total"] else "danger"
        text.value = f"<code>{html.escape(bar_text(st))}</code>"
        entry["dirty"] = False

    def _relayout(self) -> None:
        order = sorted(self.bars, key=lambda k: (k[1], k[0]) if self.scope == "all" else (k[0], k[1]))
        self.bars_box.children = tuple(self.bars[k]["widget"] for k in order)

    def _draw_status(self) -> None:
        rep = self.report
        elapsed = fmt_elapsed(self.elapsed if self.elapsed is not None else time.monotonic() - self.t0)
        link, logs = run_link_html(rep.log_dir, run_name(rep)), log_links_html(rep.log_dir, rep.world_size)
        ranks = f"{rep.world_size} ranks ({rep.backend}, {rep.start_method})"
        if self.ended is not None and rep.state not in (RunState.DONE, RunState.RUNNING):
            detail = f" · {html.escape(self.detail)}" if self.detail else ""
            self.status.value = (
                f'<span style="color: var(--jp-error-color1, #c00)"><b>nblaunch: {html.escape(self.ended)}</b></span> '
                f"{link} · {ranks}{detail} · {elapsed} · logs: {logs}"
            )
            return
        state = html.escape(self.ended) if self.ended is not None else self._counts()
        idle = f"<br>{IDLE_NOTE}" if self.first_widget else ""
        self.status.value = f"<b>nblaunch</b> {link} · {ranks}: {state} · {elapsed} · logs: {logs}{idle}"

    def _counts(self) -> str:
        counts = {state: 0 for state in RankState}  # in the enum's order: starting, running, ... done, failed
        for r in self.report.ranks:
            counts[r.state] += 1  # the recorder's
        return " · ".join(f"{v} {k}" for k, v in counts.items() if v)


def make_run_display(report, output: str, scope: str) -> RunDisplay | None:
    if render_mode(output) != "widgets":
        return None
    return RunDisplay(report, scope)
