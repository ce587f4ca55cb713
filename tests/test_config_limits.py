"""Config files that anyone can make odd, read by a launch: each gives the ``LaunchConfigError`` that names the
file, the key and the value (or the line), quickly, before any rank starts. Each test writes its hostile
``nblaunch.yaml`` itself under a temporary folder."""

from __future__ import annotations

import json
import os
import time

import pytest

from kernelside import notebook_launcher
from kernelside.config import MAX_CONFIG_BYTES, MAX_DEPTH, MAX_VALUES, resolve_config
from kernelside.errors import LaunchConfigError

pytestmark = pytest.mark.usefixtures("no_leaks")

ALIAS_BOMB = "\n".join(
    ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    + [f"{n}: &{n} [" + ", ".join([f"*{p}"] * 9) + "]" for p, n in zip("abcdefgh", "bcdefghi", strict=True)]
    + ["fsdp_config: {sharding_strategy: *i}", ""]
)  # 9**9 = 387,420,489 values once expanded, in 400 bytes


def touch(path):
    open(path, "w").close()


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    monkeypatch.delenv("NBLAUNCH_CONFIG", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))


HOSTILE = {  # name: (the file, fragments of the message; {path} is the file's)
    "superscript-two": ("num_processes: '²'\n", ["invalid num_processes='²' (in {path})", "an integer >= 1"]),
    "nul-in-env": (
        'env:\n  OMP_NUM_THREADS: "4\\0rm -rf"\n',
        ["invalid env={'OMP_NUM_THREADS': '4\\x00rm -rf'} (in {path})", "the value of 'OMP_NUM_THREADS' holds a NUL"],
    ),
    "deep-yaml": (
        "fsdp_config:\n" + "".join(" " * (2 * i + 2) + f"k{i}:\n" for i in range(200)) + " " * 402 + "v: 1\n",
        [f"{{path}} nests values more than {MAX_DEPTH} levels deep (at line {MAX_DEPTH + 1}, under 'fsdp_config')"],
    ),
    "deep-json": (
        "deepspeed_config: " + '{"a": ' * 40 + "1" + "}" * 40 + "\n",
        [f"{{path}} nests values more than {MAX_DEPTH} levels deep (at line 1, under 'deepspeed_config')"],
    ),
    "json-100000-deep": ("deepspeed_config: " + "[" * 100_000 + "]" * 100_000 + "\n", ["{path} ", "nest"]),
    "binary-garbage": (
        b"\x7fELF\x02\x01\x01\x00\xff\xfe\x00garbage\n",
        ["{path} is not UTF-8 text (byte 0xff at line 1"],
    ),
    "alias-bomb": (ALIAS_BOMB, [f"{{path}} holds more than {MAX_VALUES:,} values", "YAML alias (*name)"]),
    "self-alias": ("gpu_ids: &x [*x]\n", ["{path}: the alias *x (at line 1, under 'gpu_ids') stands for a value"]),
    "ten-megabytes": ("# " + "x" * (10 << 20) + "\n", ["{path} is 10,485,763 bytes; a launch config is at most"]),
    "huge-integer": ("num_processes: " + "9" * 5000 + "\n", ["{path} is not valid YAML at line 1", "5,000 digits"]),
    "not-a-mapping": ("- 1\n- 2\n", ["{path} must hold a mapping of keys to values, found list"]),
}


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
