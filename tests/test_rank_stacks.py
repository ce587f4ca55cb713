"""Every rank's stack, asked of a running cell's kernel through its control socket (as the server's
stacks route asks it): cell lines and notebook functions named as the notebook shows them, the
collective a rank waits in, and a rank that cannot answer named with the reason."""

from __future__ import annotations

import json
import os
import re
import time

import pytest
from harness import wait_until
from kernel import Cell

from jupyter_ext.run_files import RunDir
from kernelside.launch.rank_stacks import StackRequest, describe


def _running_folder(base):
    for d in base.glob("run-*"):
        try:
            state = json.loads((d / "state.json").read_text())
        except (OSError, ValueError):
            continue
        if state.get("state") == "running" and all((d / f"rank{r}.stacks").exists() for r in (0, 1)):
            return d
    return None


@pytest.fixture
def kernel(new_kernel, tmp_path):
    return new_kernel(load_ext=False, cwd=tmp_path, env={"TMPDIR": str(tmp_path)})


def test_stacks_of_a_running_cell_name_its_lines_the_notebook_function_and_the_barrier(kernel, tmp_path):
    kernel.run("%load_ext kernelside").ok()
    defined = kernel.run(
        "def hold(path):\n    import os, time\n\n    while not os.path.exists(path): time.sleep(0.01)  # one line\n"
    ).ok()
    count = defined.reply["execution_count"]
    fn_cell = f"cell In[{count}]"
    cell = Cell()
    cell.msg_id = kernel.kc.execute(
        "%%distributed -n 2\nimport torch.distributed as dist\nif rank == 0:\n    hold('release')\ndist.barrier()\n"
    )
    folder = wait_until(lambda: _running_folder(tmp_path / f"nblaunch-{os.getuid()}"), what="the running cell")
    wait_until(lambda: (folder / "rank1.log").exists(), what="rank 1")
    try:
        with RunDir.open(str(folder)) as d:
            t0 = time.monotonic()
            answer = wait_until(
                lambda: (
                    (a := d.request({"op": "stacks"}, 2.0, max_bytes=1 << 22))["ranks"][1].get("collective")
                    and "in hold" in (a["ranks"][0].get("where") or "")
                    and a["ranks"][0].get("calling") == "sleep"  # (not between two sleeps, in os.path.exists)
                    and a
                ),
                what="rank 1 in its barrier and rank 0 in hold(), calling sleep()",
            )
            assert time.monotonic() - t0 < 5
            assert abs(answer["taken"] - time.time()) < 10  # when the ranks were asked, for "taken at"
    finally:
        (tmp_path / "release").touch()
    kernel.wait(cell).ok()
    # the %%distributed cell is named as the magic labels it (its own count: notebook-polish aligns it)
    launch_cell = re.match(r"cell In\[\d+\]", answer["ranks"][1]["where"]).group(0)
    r0, r1 = answer["ranks"]
    assert r1["collective"] == "barrier" and r1["where"] == f"{launch_cell}, line 5 in <module>"
    assert r0["collective"] is None and r0["where"] == f"{fn_cell}, line 4 in hold"
    assert [f["where"] for f in r0["frames"]][:2] == [
        f"{launch_cell}, line 4 in <module>",
        f"{fn_cell}, line 4 in hold",
    ]
    # the line's text and the C function the rank calls there: what the frames alone do not say
    assert r0["source"] == "while not os.path.exists(path): time.sleep(0.01)  # one line"
    assert r1["source"] == "dist.barrier()" and r1["calling"] is None  # in a collective: that names it
    assert describe(answer).splitlines() == [
        f"rank 0: {fn_cell}, line 4 in hold, calling sleep()",
        f"rank 1: {launch_cell}, line 5 in <module>, waiting in torch.distributed.barrier()",
    ]


def test_a_rank_that_has_ended_or_not_set_up_is_named_not_asked(tmp_path):
    (tmp_path / "rank1.stacks").write_text("not nblaunch's\n")
    got = StackRequest.send(str(tmp_path), [(0, os.getpid(), "exit code 0"), (1, os.getpid(), None), (2, 1, None)])
    answer = got.collect(timeout=0.1)
    reasons = [r["reason"] for r in answer["ranks"]]
    assert reasons == [
        "rank 0 has ended (exit code 0): no stack to show",
        f"rank 1's stack file {tmp_path / 'rank1.stacks'} is not nblaunch's: not asked",
        "rank 2 is still starting: it cannot show its stack yet (ask again in a moment)",
    ]
