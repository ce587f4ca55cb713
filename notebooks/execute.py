"""Execute a notebook headless in a real kernel and write the executed copy next to the build.

    python notebooks/execute.py notebooks/quickstart.ipynb [--out build/notebooks]

Widget state is stored in the executed notebook, so progress bars show when it is reopened.
Exit status 1 (and the failing cell's error) if any cell fails.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError


def execute(path: str, out_dir: str, timeout: int = 600) -> tuple[str, nbformat.NotebookNode]:
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        store_widget_state=True,
        resources={"metadata": {"path": os.path.dirname(os.path.abspath(path))}},
    )
    try:
        client.execute()
    finally:
        os.makedirs(out_dir, exist_ok=True)
        out = os.path.join(out_dir, os.path.basename(path).replace(".ipynb", ".executed.ipynb"))
        nbformat.write(nb, out)
    return out, nb


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("notebooks", nargs="+")
    ap.add_argument("--out", default="build/notebooks", help="folder for the executed copies")
    ns = ap.parse_args()
    for path in ns.notebooks:
        t0 = time.monotonic()
        try:
            out, nb = execute(path, ns.out)
        except CellExecutionError as e:
            print(f"FAILED {path}:\n{e}", file=sys.stderr)
            return 1
        streams = [
            o.get("text", "")
            for c in nb.cells
            if c.cell_type == "code"
            for o in c.get("outputs", [])
            if o.get("output_type") == "stream" and o.get("name") == "stdout"
        ]
        print("".join(streams).rstrip())
        print(
            f"\nexecuted {path} in {time.monotonic() - t0:.1f}s without error; executed notebook written to "
            f"{os.path.abspath(out)}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
