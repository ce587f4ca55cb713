"""``%distributed_last`` as HTML: the run's summary and per-rank table, each rank's log file a link that nblaunch's
JupyterLab extension opens in a log tab (``a.nblaunch-log-link``), the run's name a link to its dashboard tab.
The file's path is the link's hover text, so the table still says where the logs are without the extension.

Example::

    >>> report_html(last_report())  # doctest: +SKIP
    '<div class="nblaunch-report"><p><b>nblaunch run: ok</b> ...'
"""

from __future__ import annotations

import html
import os

from .run_links import run_id_of, run_link_html, run_name


def _cell(value) -> str:
    return f"<td>{html.escape('-' if value is None else str(value))}</td>"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _log_link(report, rank) -> str:
    if not rank.log_path:
        return "<td>-</td>"
    run_id = html.escape(run_id_of(report.log_dir), quote=True)
    path = html.escape(rank.log_path, quote=True)
    return (
        f'<td><a class="nblaunch-log-link" href="#" data-nblaunch-run="{run_id}" data-nblaunch-rank="{rank.rank}" '
        f'title="{path}">{html.escape(os.path.basename(rank.log_path))}</a></td>'
    )


def report_html(report) -> str:
    """The run report (a ``LaunchReport``) as an HTML table with linked log files."""
    gpu = any(r.gpu_index is not None for r in report.ranks)
    head = ["rank", "pid", "ready (s)", "ended (s)", "exit", "log"]
    if gpu:
        head += ["GPU", "GPU memory (MiB)", "GPU util (%)"]
    rows = []
    for r in report.ranks:
        cells = [_cell(r.rank), _cell(r.pid), _cell(_seconds(r.ready_s)), _cell(_seconds(r.ended_s)), _cell(r.exit)]
        cells.append(_log_link(report, r))
        if gpu:
            mib = None if r.gpu_memory_bytes is None else f"{r.gpu_memory_bytes / 2**20:.0f}"
            cells += [_cell(r.gpu_index), _cell(mib), _cell(r.gpu_util_percent)]
        rows.append("<tr>" + "".join(cells) + "</tr>")
    live = f" ({html.escape(report.session)})" if report.session else ""
    metrics = f", {len(report.metrics)} metrics points in <code>.metrics_frame()</code>" if report.metrics else ""
    summary = (
        f"<b>nblaunch run: {html.escape(report.outcome)}</b>{live} — {run_link_html(report.log_dir, run_name(report))}"
        f" · {report.world_size} ranks, {html.escape(report.backend)}, {html.escape(report.start_method)}, "
        f"start-up {report.startup_s or 0:.2f}s, wall {report.wall_s or 0:.2f}s{metrics}"
    )
    table = (
        "<table><thead><tr>"
        + "".join(f"<th>{h}</th>" for h in head)
        + "</tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table>"
    )
    where = f'<p style="opacity: 0.8">logs in <code>{html.escape(report.log_dir)}</code></p>'
    return f'<div class="nblaunch-report"><p>{summary}</p>{table}{where}</div>'
