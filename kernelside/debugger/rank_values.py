"""A rank's variables in the panel beyond their text: the rich view (``richInspectVariables``) and "Copy
Variable to Globals" (``copyToGlobals``).

ipykernel answers both for its own frames with one request to its debugger in the stopped frame: the rich
view evaluates ``get_ipython().display_formatter.format(name)`` there, the copy sets ``globals()[dst] = src``
(``setExpression``). A rank has no IPython shell and its frame's globals are not the notebook's, so the
rank's frame evaluates ``worker.debug_values.rich_view(name)`` (its own display formatter) and
``debug_values.copied(globals(), dst, src)``: the value lands in the frame's globals, as ipykernel's does, and
comes back pickled (tensors on CPU, as a result does) for the notebook's namespace, the kernel's globals.

Example::

    ask = rich_request({"variableName": "x", "frameId": 3})   # an ``evaluate`` for the rank's pydevd
    rich_body(answer)                                         # {'data': {'text/plain': '1'}, 'metadata': {}}
"""

from __future__ import annotations

import ast
import base64
import json

RANK_SIDE = "__import__('kernelside.worker.debug_values', fromlist=['debug_values'])"
NOTHING = {"data": {}, "metadata": {}}


def rich_request(arguments: dict) -> dict | None:
    """The ``evaluate`` arguments that make the rank show ``variableName`` richly; None for a name that is no
    variable (the panel's "special variables" groups), which has no rich view."""
    name = arguments.get("variableName", "")
    if not str(name).isidentifier():
        return None
    expression = f"{RANK_SIDE}.rich_view({name})"
    return {"expression": expression, "frameId": arguments.get("frameId"), "context": "clipboard"}


def rich_body(answer: dict) -> dict:
    """The panel's ``richInspectVariables`` body from the rank's ``evaluate`` answer (nothing shown for a
    variable the rank could not format: the panel keeps its text)."""
    if not answer.get("success"):
        return dict(NOTHING)
    try:
        shown = json.loads(_text_of(answer))
    except (ValueError, SyntaxError, TypeError):
        return dict(NOTHING)
    return {"data": dict(shown.get("data") or {}), "metadata": dict(shown.get("metadata") or {})}


def copy_request(arguments: dict) -> dict | None:
    """The ``evaluate`` arguments that copy ``srcVariableName`` to ``dstVariableName`` in the rank's frame
    globals and return it pickled; None when either is not an identifier."""
    src, dst = arguments.get("srcVariableName", ""), arguments.get("dstVariableName", "")
    if not (str(src).isidentifier() and str(dst).isidentifier()):
        return None
    expression = f"{RANK_SIDE}.copied(globals(), {dst!r}, {src})"
    return {"expression": expression, "frameId": arguments.get("srcFrameId"), "context": "clipboard"}


def copied_value(answer: dict):
    """The value the rank copied (``copy_request``), unpickled here; raises ValueError with the rank's words
    when it could not be evaluated or pickled."""
    if not answer.get("success"):
        raise ValueError(answer.get("message") or (answer.get("body") or {}).get("result") or "not evaluated")
    import cloudpickle

    return cloudpickle.loads(base64.b64decode(_text_of(answer)))


def _text_of(answer: dict) -> str:
    """The string an ``evaluate`` returned: pydevd answers with its repr (quoted)."""
    result = (answer.get("body") or {}).get("result", "")
    value = ast.literal_eval(result)
    if not isinstance(value, str):
        raise TypeError(f"not text: {result[:80]!r}")
    return value
