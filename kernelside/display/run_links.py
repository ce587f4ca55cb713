"""The links in a cell's status line: the run's short name, which nblaunch's JupyterLab extension opens as the
run's dashboard tab (``a.nblaunch-run-link[data-nblaunch-run]``), and one link per rank's log
(``a.nblaunch-log-link[data-nblaunch-run][data-nblaunch-rank]``), both read by its document-level click handler.

Without the extension the links do nothing; the run's log folder is still in their hover text (``title``).

Example::

    >>> run_link_html("/tmp/nblaunch-0/run-20250101-120000-ab12cd34", "train 12:00:00")
    '<a class="nblaunch-run-link" href="#" data-nblaunch-run="run-20250101-120000-ab12cd34" title="...">train ...'
"""

from __future__ import annotations

import html
import os
import time

# The run's name reads as a link with or without the extension's stylesheet.
LINK_STYLE = "color: var(--jp-content-link-color, #1976d2); text-decoration: underline"
MAX_LINKS = 8  # beyond this many ranks the status line links the first ones and says how many more


def run_id_of(log_dir: str) -> str:
    """The run's id as the server lists it: its run folder's name."""
    return os.path.basename(log_dir.rstrip("/"))


def run_name(report) -> str:
    """A short name a user can tell runs apart by: a live session's cell, else the notebook and start time."""
    if getattr(report, "session", ""):
        return report.session
    stem = os.path.splitext(os.path.basename(os.environ.get("JPY_SESSION_NAME", "")))[0]
    return f"{stem or 'run'} {time.strftime('%H:%M:%S', time.localtime(report.started_at))}"


def run_link_html(log_dir: str, name: str) -> str:
    """The run's name, linked to its dashboard tab; the log folder in its hover text."""
    run_id = html.escape(run_id_of(log_dir), quote=True)
    title = html.escape(f"Open this run in the Runs dashboard. Logs: {log_dir}", quote=True)
    return (
        f'<a class="nblaunch-run-link" href="#" data-nblaunch-run="{run_id}" title="{title}" '
        f'style="{LINK_STYLE}">{html.escape(name)}</a>'
    )


def log_links_html(log_dir: str, world_size: int) -> str:
    """One link per rank's log (at most MAX_LINKS); each names the log folder in its hover text."""
    run_id = html.escape(run_id_of(log_dir), quote=True)
    links = [
        f'<a class="nblaunch-log-link" href="#" data-nblaunch-run="{run_id}" data-nblaunch-rank="{r}" '
        f'title="{_log_title(r, log_dir)}">rank {r}</a>'
        for r in range(min(world_size, MAX_LINKS))
    ]
    more = f", {world_size - MAX_LINKS} more in the Runs panel" if world_size > MAX_LINKS else ""
    return ", ".join(links) + more


def _log_title(rank: int, log_dir: str) -> str:
    return html.escape(f"Open rank {rank}'s log in a JupyterLab tab. Logs: {log_dir}", quote=True)
