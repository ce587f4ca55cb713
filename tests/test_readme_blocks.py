"""Every Python block of the README runs as written, in order, in a real kernel on 2 CPU ranks: the README
cannot drift from the code again (a missing import, an undefined name, a renamed flag fails here)."""

from __future__ import annotations

import importlib.util
import os
import re

import nbformat
import pytest
from kernel import REPO

pytestmark = pytest.mark.kernel  # starts kernels


spec = importlib.util.spec_from_file_location("execute_nb", os.path.join(REPO, "notebooks", "execute.py"))
execute_nb = importlib.util.module_from_spec(spec)
spec.loader.exec_module(execute_nb)

BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def python_blocks(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [b.rstrip("\n") for b in BLOCK.findall(f.read())]


def _texts(cell) -> str:
    out = []
    for o in cell.outputs:
        out.append(o.get("text", ""))
        out.append(o.get("data", {}).get("text/plain", ""))
    return "".join(out)


def test_every_python_block_of_the_readme_runs_in_a_kernel_on_two_ranks(tmp_path):
    blocks = python_blocks(os.path.join(REPO, "README.md"))
    assert len(blocks) >= 4 and blocks[0] == "%load_ext kernelside"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(b) for b in blocks])
    path = tmp_path / "readme.ipynb"
    nbformat.write(nb, path)
    _, done = execute_nb.execute(str(path), str(tmp_path / "out"), timeout=300)  # raises on the first failing block
    texts = [_texts(c) for c in done.cells]
    cell = next(t for b, t in zip(blocks, texts, strict=True) if b.startswith("%%distributed"))
    assert "rank 0/2 done" in cell and "rank 1/2" not in cell
    launched = next(t for b, t in zip(blocks, texts, strict=True) if "notebook_launcher(train" in b)
    assert launched.strip().endswith("'rank 0 of 2 trained with lr=0.1'")
