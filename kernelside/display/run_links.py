"""Links to each rank's log in a cell's status line, which nblaunch's JupyterLab extension opens
in a log tab (its document-level click handler reads ``data-nblaunch-run`` / ``-rank``).

Without the extension the links do nothing and the folder path beside them still says where
the logs are.

Example::

    >>> log_links_html("/tmp/nblaunch-0/run-20250101-120000-ab12cd34", 2)
    '<code>/tmp/nblaunch-0/run-20250101-120000-ab12cd34</code> (<a class="nblaunch-log-link" ...>rank 0</a>, ...)'
"""

from __future__ import annotations

import html
import os

MAX_LINKS = 8  # beyond this many ranks the status line links the first ones and says how many more


def log_links_html(log_dir: str, world_size: int) -> str:
    """The log folder, followed by one link per rank (at most MAX_LINKS)."""
    run_id = html.escape(os.path.basename(log_dir.rstrip("/")), quote=True)
    links = [
        f'<a class="nblaunch-log-link" href="#" data-nblaunch-run="{run_id}" data-nblaunch-rank="{r}" '
        f'title="Open rank {r}\'s log in a JupyterLab tab">rank {r}</a>'
        for r in range(min(world_size, MAX_LINKS))
    ]
    more = f", {world_size - MAX_LINKS} more in the Runs panel" if world_size > MAX_LINKS else ""
    opened = f" ({', '.join(links)}{more})" if links else ""
    return f"<code>{html.escape(log_dir)}</code>{opened}"
