"""Every code block of the README and of the docs guides runs as written: each page's Python blocks, in order,
in a fresh real kernel on 2 CPU ranks (a missing import, an undefined name, a renamed flag fails here). A block
that cannot run on this machine says so in the source, on the line before it: ``<!-- not run: why -->``; the
ones allowed are listed below, with their reasons, so the list stays short. ``text`` blocks are output shown,
and MyST directives (``{toctree}``, ``{eval-rst}``) are Sphinx's (tests/test_docs.py builds them)."""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

import nbformat
import pytest
from kernel import REPO

pytestmark = pytest.mark.kernel  # starts kernels


spec = importlib.util.spec_from_file_location("execute_nb", os.path.join(REPO, "notebooks", "execute.py"))
execute_nb = importlib.util.module_from_spec(spec)
spec.loader.exec_module(execute_nb)

FENCE = re.compile(r"^(?:<!-- not run: (?P<why>.+?) -->\n)?```(?P<lang>[^\n]*)\n(?P<body>.*?)^```", re.S | re.M)
PAGES = ["README.md", *sorted(str(p.relative_to(REPO)) for p in Path(REPO, "docs", "guide").glob("*.md"))]

# (page, the block's first line) -> why it is not run here. Adding one means adding it here too.
NOT_RUN = {
    ("README.md", "pip install ."): "run by tests/panel_browser/test_wheel_install.py (wheel into a new venv)",
    ("README.md", "jupyter labextension list"): "run by tests/panel_browser/test_wheel_install.py, in the new venv",
    ("README.md", "%distributed_start -n 4 --engine ray"): (
        "starts live ranks on a Ray cluster; tests/test_ray_live.py runs notebooks/ray_live.ipynb on one"
    ),
    ("docs/guide/install.md", "pip install ."): "the README's install lines: run by test_wheel_install.py",
    ("docs/guide/install.md", "jupyter labextension list"): "the README's check lines: run by test_wheel_install.py",
    ("docs/guide/install.md", "pip uninstall nblaunch"): "run by tests/panel_browser/test_wheel_install.py",
    ("docs/guide/gpu-kit.md", "make test-gpu"): "needs a CUDA GPU",
    ("docs/guide/gpu-kit.md", "make gpu-wheels"): "downloads Python 3.12 wheels for a GPU machine",
    ("docs/guide/multi-machine.md", "%%distributed -n 8 --engine ray"): "needs a Ray cluster and 8 ranks",
    ("docs/guide/multi-machine.md", "notebook_launcher(train, args=(cfg,), num_processes=8"): ("needs two machines"),
    ("docs/guide/multi-machine.md", "torchrun --nnodes 1"): (
        "the commands %distributed_export prints; tests/test_export.py runs them"
    ),
    ("docs/guide/panel.md", 'curl -s -H "Authorization: token $TOKEN"'): (
        "needs a running server's token and a run id; tests/panel_routes/ asks these routes"
    ),
}


def code_blocks(page: str) -> list[tuple[str, str, str | None]]:
    """(language, body, why not run) of each fenced block of the page, in order."""
    text = Path(REPO, page).read_text(encoding="utf-8")
    return [(m["lang"].strip(), m["body"].rstrip("\n"), m["why"]) for m in FENCE.finditer(text)]


def _texts(cell) -> str:
    out = []
    for o in cell.outputs:
        out.append(o.get("text", ""))
        out.append(o.get("data", {}).get("text/plain", ""))
    return "".join(out)


def _key(page: str, body: str) -> tuple[str, str]:
    """The block's entry in NOT_RUN: the page and the listed start of the block (else its first line)."""
    listed = [start for p, start in NOT_RUN if p == page and body.startswith(start)]
    return (page, listed[0] if listed else body.splitlines()[0])


def test_every_block_is_python_or_text_or_marked_with_why_it_is_not_run_and_the_marked_ones_are_the_listed_ones():
    marked = {}
    for page in PAGES:
        for lang, body, why in code_blocks(page):
            if why is not None:
                marked[_key(page, body)] = why
            else:
                assert lang == "python" or lang == "text" or lang.startswith("{"), (
                    f"{page}: a ```{lang} block that is not run and says nothing of why "
                    f"(mark it <!-- not run: why --> and list it in NOT_RUN):\n{body}"
                )
    assert set(marked) == set(NOT_RUN), "the blocks marked <!-- not run --> and NOT_RUN differ"
    for key, why in marked.items():
        assert why == NOT_RUN[key], f"{key}: the page says {why!r}, NOT_RUN says {NOT_RUN[key]!r}"
    print("not run here:\n" + "\n".join(f"  {page}: {line!r}: {why}" for (page, line), why in NOT_RUN.items()))


RUN_PAGES = [p for p in PAGES if any(lang == "python" and why is None for lang, _, why in code_blocks(p))]


@pytest.mark.parametrize("page", RUN_PAGES)
def test_the_python_blocks_of_each_page_run_as_written_in_a_kernel_on_two_ranks(page, tmp_path):
    blocks = [body for lang, body, why in code_blocks(page) if lang == "python" and why is None]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(b) for b in blocks])
    path = tmp_path / "page.ipynb"
    nbformat.write(nb, path)
    _, done = execute_nb.execute(str(path), str(tmp_path / "out"), timeout=300)  # raises on the first failing block
    texts = dict(zip(blocks, (_texts(c) for c in done.cells), strict=True))
    if page == "README.md":
        assert blocks[0] == "%load_ext kernelside"
        cell = next(t for b, t in texts.items() if b.startswith("%%distributed"))
        assert "rank 0/2 done" in cell and "rank 1/2" not in cell
        launched = next(t for b, t in texts.items() if "notebook_launcher(train" in b)
        assert launched.strip().endswith("'rank 0 of 2 trained with lr=0.1'")
    for body, text in texts.items():  # a block whose last line shows its result ("# (1, {'x': 0})") gives that
        shown = re.search(r"#\s*(\(.*\))\s*$", body.splitlines()[-1])
        if shown:
            assert shown[1] in text, f"{page}: {body!r} shows {shown[1]!r}, the kernel printed {text!r}"
