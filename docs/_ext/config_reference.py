"""Sphinx extension: the configuration reference is generated from ``kernelside/config/fields.py``,
so the docs cannot miss a key. A page names the place with a line ``<!-- config-reference -->``."""

from __future__ import annotations

MARKER = "<!-- config-reference -->"


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _allowed(field) -> str:
    if field.choices is not None:
        return ", ".join(f"`{c}`" for c in field.choices)
    low, high = field.minimum, field.maximum
    if low is None and high is None:
        return field.type
    bound = (">" if field.above_minimum else "≥") + f" {low:g}" if low is not None else ""
    return f"{field.type} {bound}{' and ' if low is not None and high is not None else ''}" + (
        f"≤ {high:g}" if high is not None else ""
    )


def reference_table() -> str:
    """One row per key of the schema: name, default, what is allowed, whether Accelerate has it, help."""
    from kernelside.config.fields import FIELDS

    rows = ["| key | default | allowed | Accelerate's too | what it does |", "| --- | --- | --- | --- | --- |"]
    for f in FIELDS:
        default = "empty" if f.default is None else f"`{f.default!r}`"
        allowed = _allowed(f) + (" or empty" if f.nullable else "")
        rows.append(
            f"| `{f.name}` | {_cell(default)} | {_cell(allowed)} | {'yes' if f.accelerate else ''} | {_cell(f.help)} |"
        )
    return "\n".join(rows) + "\n"


def _fill(app, docname, source):
    if MARKER in source[0]:
        source[0] = source[0].replace(MARKER, reference_table())


def setup(app):
    app.connect("source-read", _fill)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
