"""Hostile config files and requests through a real Jupyter server: the config route answers with the kernel's
own ``LaunchConfigError`` message (a 400 for a request, the form's ``error`` for a file on disk), never a 500;
route parameters are parsed strictly (ASCII digits, bounded length); and the server's event loop is never
blocked while a file is read. Each test makes its hostile input itself."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from harness import ALIAS_BOMB, HOSTILE, fetch, fetch_json, forge_run

from kernelside.config import resolve_config
from kernelside.errors import LaunchConfigError


def kernel_message(path) -> str:
    """What a launch from the server's root says about this file."""
    with pytest.raises(LaunchConfigError) as refused:
        resolve_config(config=path)
    return str(refused.value)


@pytest.mark.parametrize("name", list(HOSTILE))
async def test_a_hostile_config_file_shows_the_kernels_message_never_a_500(jp_fetch, jp_root_dir, run_base, name):  # noqa: F811
    text, _ = HOSTILE[name]
    path = jp_root_dir / "nblaunch.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    expected = kernel_message(path)
    code, got = await fetch_json(jp_fetch, "config")
    assert code == 200 and got["error"]["message"] == expected, got["error"]
    assert got["values"]["backend"] == "auto"  # the form still draws, with the defaults where the file fails
    code, runs = await fetch(jp_fetch)  # the runs list reads the config's log_dir: it lists the runs anyway
    assert code == 200 and runs == []
    code, answer = await fetch_json(jp_fetch, "config", method="PUT", body={"values": {"num_processes": 2}})
    if got["error"]["key"] is None:  # the file as a whole is unreadable: not overwritten unasked
        assert code == 409 and expected in answer["message"]
        assert path.read_bytes() == (text if isinstance(text, bytes) else text.encode())
    else:  # one bad value: a save replaces it
        assert code == 200 and answer["error"] is None


async def test_the_alias_bomb_is_answered_at_once_and_reads_leave_the_event_loop_free(jp_fetch, jp_root_dir):
    (jp_root_dir / "nblaunch.yaml").write_text(ALIAS_BOMB)
    t0 = time.perf_counter()
    code, got = await fetch_json(jp_fetch, "config")
    bomb_ms = (time.perf_counter() - t0) * 1000
    assert code == 200 and "holds more than 10,000 values" in got["error"]["message"]
    # the largest file the limits let through, read by eight requests at once: the server answers another
    # request meanwhile (before, every read ran on its event loop, one after the other, and the status waited)
    (jp_root_dir / "nblaunch.yaml").write_text("".join(f"key_{i}: {'v' * 190}\n" for i in range(4990)))
    t0 = time.perf_counter()
    configs = [asyncio.ensure_future(fetch_json(jp_fetch, "config")) for _ in range(8)]
    await asyncio.sleep(0.05)  # the reads have begun
    s0 = time.perf_counter()
    status = await jp_fetch("api", "status")
    status_ms = (time.perf_counter() - s0) * 1000
    still_reading = sum(not c.done() for c in configs)
    answers = await asyncio.gather(*configs)
    total_ms = (time.perf_counter() - t0) * 1000
    assert status.code == 200 and all(code == 200 and len(a["unknown_keys"]) == 4990 for code, a in answers)
    print(
        f"alias bomb answered in {bomb_ms:.0f} ms; /api/status in {status_ms:.0f} ms while 8 reads of a 1 MB "
        f"config took {total_ms:.0f} ms ({still_reading} of them still reading when it was answered)"
    )
    assert still_reading > 0, "/api/status waited for every read of the config: they ran on the event loop"


@pytest.mark.parametrize(
    "body, fragment",
    [
        ('{"values": ' * 100_000 + "{}" + "}" * 100_000, "nests deeper than a launch setting can"),
        ('{"values": {"deepspeed_config": ' + '{"a": ' * 60 + "1" + "}" * 60 + "}}", "nests deeper than"),
        ({"values": {"num_processes": "²"}}, "num_processes: got '²'; allowed: an integer >= 1"),
        ({"values": {"main_process_port": "9" * 5000}}, "main_process_port: got '9999"),
        ({"values": {"env": {"A": "x\x00y"}}}, "the value of 'A' holds a NUL character"),
        ({"values": {"deepspeed_config": json.loads('{"a": ' * 33 + "1" + "}" * 33)}}, "nests deeper than"),
    ],
    ids=["json-100000-deep", "json-60-deep-value", "superscript-two", "5000-digits", "nul-in-env", "33-deep-value"],
)
async def test_a_hostile_save_answers_400_with_the_message_never_a_500(jp_fetch, jp_root_dir, body, fragment):
    code, answer = await fetch_json(jp_fetch, "config", method="PUT", body=body)
    assert code == 400 and fragment in answer["message"], answer
    assert len(answer["message"]) < 2000 and not (jp_root_dir / "nblaunch.yaml").exists()


async def test_importing_a_hostile_accelerate_file_answers_400_with_the_kernels_message(jp_fetch, jp_root_dir):
    (jp_root_dir / "acc.yaml").write_text(ALIAS_BOMB)
    code, answer = await fetch_json(jp_fetch, "accelerate", "import", method="POST", body={"path": "acc.yaml"})
    assert code == 400 and answer["message"].startswith(f"Accelerate config {jp_root_dir / 'acc.yaml'} holds more")


@pytest.mark.parametrize(
    "path, params, fragment",
    [
        (("ranks", "²", "log"), {}, "rank must be a whole number >= 0 (ASCII digits, at most 18), got '²'"),
        (("ranks", "9" * 5000, "log"), {}, "rank must be a whole number >= 0"),
        (("ranks", "٣", "log"), {}, "rank must be a whole number >= 0"),
        (("ranks", "0", "log"), {"tail": "²"}, "tail must be a whole number >= 0"),
        (("ranks", "0", "log"), {"offset": "9" * 5000}, "offset must be a whole number >= 0"),
    ],
)
async def test_malformed_route_parameters_answer_400(jp_fetch, run_base, path, params, fragment):  # noqa: F811
    forge_run(run_base, "run-20200101-000000-real", {"state": "done"})
    code, answer = await fetch(jp_fetch, "run-20200101-000000-real", *path, params=params)
    assert code == 400 and fragment in answer["message"] and len(answer["message"]) < 400, answer


@pytest.mark.parametrize("run_id", ["run-٢٠٢٠٠١٠١-000000-x", "run-20200101-000000-" + "x" * 5000, "run-²"])
async def test_a_run_id_that_is_not_ascii_or_too_long_answers_400(jp_fetch, run_base, run_id):  # noqa: F811
    code, answer = await fetch(jp_fetch, run_id)
    assert code == 400 and "is not a run id" in answer["message"] and len(answer["message"]) < 400
