"""On a shared machine, the server reads run folders by the kernel's rules (``kernelside/private_dir.py``):
a run-folder base or run folder that is a link, another user's or writable by others is not read, and a
rank's log that is not a plain file of this user's with one link is refused. Each test makes its hostile
base itself under a temporary TMPDIR; a second local user (made and removed by the test) owns what is not
this user's."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from harness import fetch, forge_run

RUN = "run-20200101-000000-planted"


@pytest.fixture
def base(tmp_path, monkeypatch) -> Path:
    """The server's default run-folder base under this test's TMPDIR (not made: each test makes its own)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    return tmp / f"nblaunch-{os.getuid()}"


def plant_elsewhere(tmp_path: Path) -> Path:
    """A folder holding a run folder with a 'secret' log, outside the base."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    forge_run(elsewhere, RUN, {"state": "done"})
    (elsewhere / RUN / "rank0.log").write_text("secret\n")
    return elsewhere


@pytest.mark.parametrize("kind", ["symlink", "world-writable", "other-user"])
async def test_a_base_that_is_not_private_is_not_read_and_the_404_says_why(jp_fetch, base, tmp_path, kind, request):
    elsewhere = plant_elsewhere(tmp_path)
    if kind == "symlink":
        base.symlink_to(elsewhere)
        why = "is a symbolic link"
    else:
        elsewhere.rename(base)
        if kind == "world-writable":
            base.chmod(0o777)
            why = "can be written by its group and every user (mode 0777)"
        else:
            user = request.getfixturevalue("other_user")
            os.chown(base, user.pw_uid, user.pw_gid)
            why = f"belongs to {user.pw_name} (uid {user.pw_uid})"
    code, runs = await fetch(jp_fetch)
    assert code == 200 and runs == []
    code, answer = await fetch(jp_fetch, RUN)
    assert code == 404 and f"(refused: {base} {why}" in answer["message"], answer
    code, answer = await fetch(jp_fetch, RUN, "ranks", "0", "log")
    assert code == 404 and "secret" not in str(answer)


async def test_a_run_folder_others_can_write_is_refused(jp_fetch, base):
    base.mkdir(mode=0o700)
    d, _ = forge_run(base, RUN, {"state": "done"})
    d.chmod(0o777)
    code, runs = await fetch(jp_fetch)
    assert code == 200 and runs == []
    code, answer = await fetch(jp_fetch, RUN)
    assert code == 403 and f"refused: {d} can be written by" in answer["message"]


async def test_a_hard_linked_rank_log_is_refused_like_a_symbolic_link(jp_fetch, base, tmp_path):
    base.mkdir(mode=0o700)
    d, _ = forge_run(base, RUN, {"state": "done"})
    private = tmp_path / "private-notes.txt"  # another file of the same user's
    private.write_text("secret\n")
    os.link(private, d / "rank3.log")
    code, answer = await fetch(jp_fetch, RUN, "ranks", "3", "log")
    assert code == 403 and "rank3.log" in answer["message"] and "has 2 hard links" in answer["message"]
    assert "secret" not in str(answer)
    code, answer = await fetch(jp_fetch, RUN, "ranks", "0", "log")  # the run's own log still reads
    assert code == 200 and "forged line 0" in answer["text"]


async def test_a_rank_log_of_another_user_is_refused(jp_fetch, base, other_user):
    base.mkdir(mode=0o700)
    d, _ = forge_run(base, RUN, {"state": "done"})
    os.chown(d / "rank0.log", other_user.pw_uid, other_user.pw_gid)
    code, answer = await fetch(jp_fetch, RUN, "ranks", "0", "log")
    assert code == 403 and "rank0.log" in answer["message"] and "belongs to another user" in answer["message"]
