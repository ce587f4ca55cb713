"""On a shared machine: the run-folder base ``$TMPDIR/nblaunch-<uid>`` is private on every path.

Each test makes its hostile base itself under a temporary TMPDIR: a symbolic link, a file, a folder others
can write, a folder another user made (a second local user, made and removed here; skipped where one cannot
be made). Real launches and a real live start: nothing is refused after a rank started, nothing lands in a
folder the user does not own, and what a run writes is owner-only, made by descriptor inside its folder.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest
from local_user import as_user

from kernelside import notebook_launcher
from kernelside.errors import LaunchError
from kernelside.live.session import LiveSession

pytestmark = pytest.mark.usefixtures("no_leaks")


def touch(path):
    """A rank's first act: proof that a rank started."""
    open(path, "w").close()
    return 1


def say(text):
    print(text, flush=True)
    return 1


@pytest.fixture
def tmpdir_base(tmp_path, monkeypatch) -> Path:
    """This test's TMPDIR; the run-folder base of the default config is ``<it>/nblaunch-<uid>``."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("NBLAUNCH_CONFIG", raising=False)
    return tmp / f"nblaunch-{os.getuid()}"


@pytest.fixture
def shared_tmp(monkeypatch):
    """A TMPDIR as a shared machine's /tmp is (mode 1777, every user may make folders in it), removed after."""
    tmp = Path(tempfile.mkdtemp(prefix="nblaunch-shared-", dir="/tmp"))
    tmp.chmod(0o1777)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.delenv("NBLAUNCH_CONFIG", raising=False)
    yield tmp
    shutil.rmtree(tmp, ignore_errors=True)


def launch_refused(marker: Path) -> str:
    with pytest.raises(LaunchError) as refused:
        notebook_launcher(touch, args=(str(marker),), num_processes=1, config=os.devnull)
    assert not marker.exists(), "a rank started although the base was refused"
    return str(refused.value)


@pytest.mark.parametrize(
    "make, fragments",
    [
        (lambda base, elsewhere: base.symlink_to(elsewhere), ["is a symbolic link (to ", "remove the link (rm "]),
        (lambda base, elsewhere: base.write_text("planted"), ["is not a folder", "remove it (rm "]),
        (lambda base, elsewhere: (base.mkdir(), base.chmod(0o777)), ["every user (mode 0777)", "chmod go-w"]),
        (lambda base, elsewhere: (base.mkdir(), base.chmod(0o770)), ["its group (mode 0770)", "chmod go-w"]),
    ],
    ids=["symlink", "file", "world-writable", "group-writable"],
)
def test_a_base_that_is_not_a_private_folder_is_refused_before_any_rank_starts(tmpdir_base, tmp_path, make, fragments):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    make(tmpdir_base, elsewhere)
    message = launch_refused(tmp_path / "rank-started")
    assert message.startswith(f"nblaunch: the run-folder base {tmpdir_base} ")
    assert all(f in message for f in fragments), message
    assert "or set log_dir to a folder of your own, or TMPDIR to another folder" in message
    assert message.endswith("Nothing was started.")
    assert list(elsewhere.iterdir()) == []  # nothing went through the link
    if tmpdir_base.is_dir() and not tmpdir_base.is_symlink():
        assert list(tmpdir_base.iterdir()) == []  # nor into the folder others can write


def test_a_log_dir_that_is_a_symbolic_link_is_refused_naming_log_dir(tmp_path, tmpdir_base):
    target = tmp_path / "target"
    target.mkdir()
    (tmp_path / "logs").symlink_to(target)
    config = tmp_path / "nblaunch.yaml"
    config.write_text(f"log_dir: {tmp_path / 'logs'}\n")
    with pytest.raises(LaunchError, match=r"nblaunch: log_dir .*/logs is a symbolic link .* or set another log_dir"):
        notebook_launcher(touch, args=(str(tmp_path / "rank-started"),), num_processes=1, config=str(config))
    assert not (tmp_path / "rank-started").exists() and list(target.iterdir()) == []


def test_a_live_start_verifies_the_base_too_and_starts_no_rank(tmpdir_base, tmp_path):
    tmpdir_base.symlink_to(tmp_path)
    before = set(tmp_path.iterdir())
    with pytest.raises(LaunchError, match="is a symbolic link"):
        LiveSession.start({"num_processes": 1}, config=os.devnull)
    assert psutil.Process().children(recursive=True) == []
    assert set(tmp_path.iterdir()) == before


def test_a_base_another_user_made_is_refused_and_nothing_is_written_into_it(shared_tmp, other_user, tmp_path):
    base = shared_tmp / f"nblaunch-{os.getuid()}"
    for mode in ("0755", "0777"):  # as anyone can on a shared /tmp, before this user's first launch
        made = as_user(other_user, "mkdir", "-m", mode, str(base))
        assert made.returncode == 0, made.stderr
        message = launch_refused(tmp_path / "rank-started")
        assert f"the run-folder base {base} belongs to {other_user.pw_name} (uid {other_user.pw_uid})" in message
        assert "its owner could read everything written there" in message
        assert list(base.iterdir()) == []
        base.rmdir()


def test_what_a_run_writes_is_owner_only_and_another_user_reads_none_of_it(shared_tmp, other_user):
    assert notebook_launcher(say, args=("secret-of-rank-0",), num_processes=2, config=os.devnull) == 1
    base = shared_tmp / f"nblaunch-{os.getuid()}"
    (run,) = base.iterdir()
    assert stat.S_IMODE(base.stat().st_mode) == 0o700 and stat.S_IMODE(run.stat().st_mode) == 0o700
    files = sorted(run.iterdir())
    assert {p.name for p in files} == {".in-use", "rank0.log", "rank0.times", "rank1.log", "rank1.times", "state.json"}
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in files} == {p.name: 0o600 for p in files}
    assert "secret-of-rank-0" in (run / "rank0.log").read_text()
    listing = as_user(other_user, "ls", str(base))
    assert listing.returncode != 0 and "Permission denied" in listing.stderr
    for path in [run / "rank0.log", run / "state.json"]:
        read = as_user(other_user, "cat", str(path))
        assert read.returncode != 0 and "Permission denied" in read.stderr and "secret" not in read.stdout


def wait_for_swap_then_say(go: str):
    import os
    import time

    print("before the swap", flush=True)
    while not os.path.exists(go):
        time.sleep(0.01)
    print("after the swap", flush=True)
    return 1


def test_a_run_folder_swapped_for_a_link_mid_launch_keeps_every_byte_in_the_real_folder(tmpdir_base, tmp_path):
    """The launch writes by the run folder's descriptor: renaming the folder away and planting a link in its
    place (what someone who could write the base would do) sends nothing through the link."""
    decoy, go = tmp_path / "decoy", tmp_path / "go"
    decoy.mkdir()
    swapped: dict = {}

    def swap():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            runs = list(tmpdir_base.glob("run-*")) if tmpdir_base.is_dir() else []
            log = runs[0] / "rank0.log" if runs else None
            if log is not None and log.exists() and "before the swap" in log.read_text():
                moved = runs[0].with_name(runs[0].name + "-moved")
                runs[0].rename(moved)
                runs[0].symlink_to(decoy)
                swapped.update(link=runs[0], moved=moved)
                break
            time.sleep(0.01)
        go.touch()

    swapper = threading.Thread(target=swap)
    swapper.start()
    try:
        assert notebook_launcher(wait_for_swap_then_say, args=(str(go),), num_processes=1, config=os.devnull) == 1
    finally:
        swapper.join(70)
    assert swapped, "the run folder never showed rank 0's first line"
    assert list(decoy.iterdir()) == [], "a write went through the planted link"
    log = (swapped["moved"] / "rank0.log").read_text()
    assert "before the swap" in log and "after the swap" in log
    assert '"state":"done"' in (swapped["moved"] / "state.json").read_text()
    swapped["link"].unlink()
