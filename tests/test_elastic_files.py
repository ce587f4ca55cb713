"""The files nblaunch keeps for a run under torch's elastic launcher (issue 28): made owner-only inside the run
folder by its descriptor, and read only as this user's plain files: a link, a FIFO or a hard link in their
place gives nothing (and never waits)."""

from __future__ import annotations

import os
import stat

import pytest

from kernelside.engines import elastic_files


def test_error_files_and_pids_round_trip_owner_only(tmp_path):
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    errors = elastic_files.make_error_dir(str(run))
    assert stat.S_IMODE(os.stat(errors).st_mode) == 0o700
    elastic_files.write_pid(errors, 3)
    elastic_files.write_error(errors, 1, {"type": "ValueError", "message": "boom"})
    assert elastic_files.read_pids(errors) == [os.getpid()]
    assert elastic_files.error_ranks(errors) == [1]
    assert elastic_files.read_error(errors, 1) == {"type": "ValueError", "message": "boom"}
    assert stat.S_IMODE(os.stat(os.path.join(errors, "rank1.error")).st_mode) == 0o600


def test_a_link_a_fifo_or_a_hard_link_in_the_error_folder_is_not_read(tmp_path):
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    errors = elastic_files.make_error_dir(str(run))
    other = tmp_path / "elsewhere"
    other.write_text("4242")
    os.symlink(other, os.path.join(errors, "rank0.pid"))
    os.mkfifo(os.path.join(errors, "rank1.pid"))
    os.link(other, os.path.join(errors, "rank2.pid"))
    os.symlink(other, os.path.join(errors, "rank5.error"))
    assert elastic_files.read_pids(errors) == []  # (and the FIFO is never waited on)
    assert elastic_files.read_error(errors, 5) is None


def test_an_error_folder_swapped_for_a_link_is_refused(tmp_path):
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    (tmp_path / "theirs").mkdir()
    os.symlink(tmp_path / "theirs", run / "errors")
    with pytest.raises(OSError):  # (not followed: ELOOP / ENOTDIR)
        elastic_files.make_error_dir(str(run))
    assert list((tmp_path / "theirs").iterdir()) == []
