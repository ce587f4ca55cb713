"""Notebook files for the browser tests: code cells, not yet run, on the default Python kernel."""

from __future__ import annotations

import json
from pathlib import Path


def write_notebook(path: Path, cells: list[str]) -> None:
    """Write ``cells`` (their sources) as a notebook at ``path``.

    Example::

        >>> write_notebook(root / "train.ipynb", ["%load_ext kernelside", "x = 1"])  # doctest: +SKIP
    """
    path.write_text(
        json.dumps(
            {
                "cells": [
                    {"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {}, "outputs": []}
                    | {"source": source}
                    for i, source in enumerate(cells)
                ],
                "metadata": {
                    "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                    "language_info": {"name": "python"},
                },
                "nbformat": 4,
                "nbformat_minor": 5,
            }
        )
    )
