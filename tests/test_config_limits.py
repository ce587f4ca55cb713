"""Config files that anyone can make odd, read by a launch: each gives the ``LaunchConfigError`` that names the
file, the key and the value (or the line), quickly, before any rank starts. Each test writes its hostile
``nblaunch.yaml`` itself under a temporary folder."""

from __future__ import annotations

import json
import os
import time

import pytest
from harness import ALIAS_BOMB, HOSTILE

from kernelside import notebook_launcher
from kernelside.config import MAX_CONFIG_BYTES, MAX_DEPTH, resolve_config
from kernelside.errors import LaunchConfigError

pytestmark = pytest.mark.usefixtures("no_leaks")


def touch(path):
    open(path, "w").close()


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    monkeypatch.delenv("NBLAUNCH_CONFIG", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_config_file_is_refused_naming_file_and_key_before_a_rank_starts(tmp_path, name):
    text, fragments = HOSTILE[name]
    path = tmp_path / "nblaunch.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    marker = tmp_path / "rank-started"
    t0 = time.monotonic()
    with pytest.raises(LaunchConfigError) as refused:
        notebook_launcher(touch, args=(str(marker),), num_processes=1, config=str(path))
    elapsed = time.monotonic() - t0
    message = str(refused.value)
    assert all(f.replace("{path}", str(path)) in message for f in fragments), message
    assert "Traceback" not in message and len(message) < 1000
    assert not marker.exists()
    assert elapsed < 5.0, f"{name}: refused after {elapsed:.1f} s"  # the alias bomb alone took minutes to expand


def test_the_alias_bomb_is_refused_before_it_is_expanded(tmp_path):
    path = tmp_path / "nblaunch.yaml"
    path.write_text(ALIAS_BOMB)
    assert len(ALIAS_BOMB) < 500
    t0 = time.perf_counter()
    with pytest.raises(LaunchConfigError, match="values"):
        resolve_config(config=path)
    print(f"alias bomb ({len(ALIAS_BOMB)} bytes) refused in {(time.perf_counter() - t0) * 1000:.1f} ms")


def test_a_config_fifo_is_refused_at_once_instead_of_hanging_the_kernel(tmp_path):
    fifo = tmp_path / "nblaunch.yaml"
    os.mkfifo(fifo)  # nobody ever writes it: opening it for reading would wait for ever
    with pytest.raises(LaunchConfigError, match=f"config file {fifo} is a FIFO or socket, not a file"):
        resolve_config(config=fifo)


def test_a_file_just_under_the_size_limit_still_loads(tmp_path):
    path = tmp_path / "nblaunch.yaml"
    comment = "# " + "x" * (MAX_CONFIG_BYTES - 40) + "\n"
    path.write_text(comment + "num_processes: 3\n")
    assert resolve_config(config=path)["num_processes"] == 3


def test_aliases_within_the_limits_still_work(tmp_path):
    path = tmp_path / "nblaunch.yaml"
    path.write_text("dynamo_config: &shared {backend: inductor}\nfsdp_config: {x: 1}\nparallelism_config: *shared\n")
    cfg = resolve_config(config=path)
    assert cfg["dynamo_config"] == cfg["parallelism_config"] == {"backend": "inductor"}


@pytest.mark.parametrize(
    "arguments, fragment",
    [
        ({"num_processes": "²"}, "invalid num_processes='²'"),
        ({"num_processes": "9" * 5000}, "invalid num_processes='99999"),
        ({"main_process_port": "٣٠٠٠"}, "invalid main_process_port='٣٠٠٠'"),
        ({"timeout": "٣"}, "invalid timeout='٣'"),
        ({"env": {"A": "x\x00"}}, "holds a NUL character"),
        ({"deepspeed_config": json.loads('{"a": ' * 200 + "1" + "}" * 200)}, f"nested at most {MAX_DEPTH} levels"),
    ],
)
def test_bad_values_from_a_call_or_flag_get_the_same_refusal_as_in_the_file(arguments, fragment):
    with pytest.raises(LaunchConfigError) as refused:
        resolve_config(arguments, config=os.devnull)  # what notebook_launcher() and %%distributed's flags go through
    assert fragment in str(refused.value) and len(str(refused.value)) < 1000


def test_a_superscript_digit_given_to_notebook_launcher_starts_nothing(tmp_path):
    marker = tmp_path / "rank-started"
    with pytest.raises(LaunchConfigError, match="invalid num_processes='²'"):
        notebook_launcher(touch, args=(str(marker),), num_processes="²", config=os.devnull)
    assert not marker.exists()
