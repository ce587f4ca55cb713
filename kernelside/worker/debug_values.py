"""What a debugged rank's stopped frame evaluates for the debugger panel (``debugger.rank_values`` sends the
expressions): a value's rich view by the rank's own display formatter, and a value copied to the frame's
globals and sent back pickled for the notebook's namespace. Worker code: it runs in the rank, with its
display and results machinery.

Example::

    >>> json.loads(rich_view(3))["data"]["text/plain"]
    '3'
"""

from __future__ import annotations

import base64
import json

from .rank_display import bundle
from .results import dumps_result, unwrap_for_return


def rich_view(value) -> str:
    """(evaluated in a stopped frame, for the panel's rich view) ``value``'s mime bundle as this rank's
    ``display()`` makes it (``rank_display.bundle``), as JSON text: ``{"data": ..., "metadata": ...}``.

    >>> json.loads(rich_view(3))["data"]["text/plain"]
    '3'
    """
    data, metadata = bundle(value)
    data = {k: base64.b64encode(v).decode() if isinstance(v, bytes) else v for k, v in data.items()}
    shown = {"data": data, "metadata": {k: v for k, v in metadata.items() if k in data}}
    return json.dumps(shown, default=repr)


def copied(namespace: dict, name: str, value) -> str:
    """(evaluated in a stopped frame, for "Copy Variable to Globals") ``value`` set as ``name`` in the frame's
    globals, as ipykernel does for its own frames; returned pickled (every tensor on CPU, as a result comes
    back), base64 text, for the notebook's namespace in the kernel."""
    namespace[name] = value
    return base64.b64encode(dumps_result(unwrap_for_return(value))).decode()
