"""--output all in a notebook: a tab per rank in the cell (rank 0 first) instead of interleaved lines; each tab
holds its rank's stdout and stderr; without widgets the lines stay [rank N]-prefixed (test_launcher). A live cell
on some of the session's ranks (--ranks) has a tab for each of those only."""

from __future__ import annotations

CELL = """%%distributed -n 2 --output all
import sys
for i in range(3):
    print(f"rank {rank} line {i}", flush=True)
print(f"warning from rank {rank}", file=sys.stderr)
"""


def _states(cell) -> dict:
    """Each widget's latest state, by comm id, from the cell's comm messages."""
    out: dict = {}
    for kind, content in cell.messages:
        if kind in ("comm_open", "comm_msg"):
            out.setdefault(content["comm_id"], {}).update(content.get("data", {}).get("state", {}))
    return out


def test_each_rank_has_its_own_tab_with_its_lines_and_rank_0_is_shown_first(kernel):
    cell = kernel.run(CELL).ok()
    states = _states(cell)
    tab = next(s for s in states.values() if s.get("_model_name") == "TabModel")
    assert tab["titles"] == ["rank 0", "rank 1"] and tab["selected_index"] == 0
    pages = [states[c.removeprefix("IPY_MODEL_")]["value"] for c in tab["children"]]
    for r in (0, 1):
        assert all(f"rank {r} line {i}" in pages[r] for i in range(3)), pages[r]
        assert f"rank {1 - r} line" not in pages[r]
        assert f"warning from rank {r}" in pages[r] and "jp-error-color1" in pages[r]
    assert "line" not in cell.stdout and "[rank" not in cell.stdout  # not interleaved in the stream too
    # the tabs sit under the status line and bars, above the chart: the printed lines in view while it runs
    tab_id = next(c for c, s in states.items() if s.get("_model_name") == "TabModel")
    box = next(s for s in states.values() if f"IPY_MODEL_{tab_id}" in s.get("children", []) and s is not tab)
    assert box["children"].index(f"IPY_MODEL_{tab_id}") == 2 and len(box["children"]) == 4, box["children"]


def test_a_live_cell_on_some_ranks_has_a_tab_for_each_of_those_ranks_only(kernel):
    kernel.run("%distributed_start -n 3").ok()
    try:
        cell = kernel.run("%%distributed --ranks 1,2 --output all\nprint(f'rank {rank} here', flush=True)").ok()
    finally:
        kernel.run("%distributed_stop").ok()
    tab = next(s for s in _states(cell).values() if s.get("_model_name") == "TabModel")
    assert tab["titles"] == ["rank 1", "rank 2"] and tab["selected_index"] == 0
    pages = [_states(cell)[c.removeprefix("IPY_MODEL_")]["value"] for c in tab["children"]]
    assert "rank 1 here" in pages[0] and "rank 2 here" in pages[1] and "rank 0" not in "".join(pages)
