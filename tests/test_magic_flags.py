"""The magics' flags, declared once (kernelside/notebook/magic_flags.py), and what a cell gives back
(kernelside/notebook/cell_targets.py): decided without a kernel."""

from __future__ import annotations

import pytest

from kernelside.errors import LaunchConfigError
from kernelside.notebook.cell_targets import CellRequest, CellResult, OneShotCells, parse_ranks
from kernelside.notebook.live_magics import LiveMagics
from kernelside.notebook.magic_flags import LAUNCH_FLAGS, SESSION_FLAGS, settings
from kernelside.notebook.magics import DistributedMagics
from kernelside.worker.cell_values import CellValues


def _options(parser) -> set[str]:
    return {s for action in parser._actions for s in action.option_strings} - {"-h", "--help"}


def test_distributed_start_takes_every_launch_setting_of_the_cell_magic_and_no_other():
    cell = DistributedMagics.distributed.parser
    start = LiveMagics.distributed_start.parser
    launch = {s for f in LAUNCH_FLAGS for s in f.names}
    assert _options(start) == launch
    assert launch < _options(cell)
    assert {"--return", "--return-from", "--ranks", "--metrics"} == _options(cell) - launch
    assert "--engine" in launch  # %distributed_start -n 4 --engine ray: live ranks on a Ray cluster


def test_cell_magic_help_lists_every_flag_with_its_help():
    text = DistributedMagics.distributed.__doc__
    for flag in ("--num-processes", "--start-method", "--return-from", "--ranks", "--port", "--timeout"):
        assert flag in text
    assert "%distributed_start: the default for each cell" in text  # a % in help survives argparse


def test_flags_read_back_under_their_schema_names_for_both_magics():
    args = DistributedMagics.distributed.parser.parse_args(["-n", "3", "--port", "29512", "--engine", "local"])
    assert settings(args) == {"num_processes": 3, "main_process_port": 29512, "engine": "local"}
    args = LiveMagics.distributed_start.parser.parse_args(["--timeout", "5", "--backend", "gloo"])
    assert settings(args) == {"timeout": 5.0, "backend": "gloo"}
    args = LiveMagics.distributed_start.parser.parse_args(["--engine", "ray", "--placement-strategy", "strict_spread"])
    assert settings(args) == {"engine": "ray", "placement_strategy": "strict_spread"}


def test_the_settings_a_live_session_fixes_come_from_the_same_table():
    assert SESSION_FLAGS == {
        "num_processes": "-n",
        "backend": "--backend",
        "start_method": "--start-method",
        "mixed_precision": "--mixed-precision",
        "gpu_ids": "--gpu-ids",
        "main_process_port": "--port",
        "engine": "--engine",
        "placement_strategy": "--placement-strategy",
    }


def test_a_shortened_flag_is_refused():
    for magic in (LiveMagics.distributed_start, DistributedMagics.distributed):
        with pytest.raises(Exception, match="unrecognized arguments: --num-proc"):
            magic.parser.parse_args(["--num-proc", "2"])


def test_a_cell_result_takes_the_chosen_ranks_values_and_lists_them_by_rank_for_all():
    values = [CellValues(last=r * 10, returned={"x": r}) for r in range(3)]
    one = CellResult.gather(values, CellRequest("x = rank", return_names=("x",), return_from=2), (0, 1, 2), 2)
    assert (one.value, one.names) == (0, {"x": 2})
    every = CellResult.gather(values, CellRequest("x = rank", return_names=("x",)), (1, 2), "all")
    assert (every.value, every.names) == (10, {"x": [1, 2]})


def test_a_return_name_the_rank_did_not_define_is_named_with_what_exists():
    values = [CellValues(last=None, returned={}, missing=["modle"], available=["model"])]
    with pytest.raises(LaunchConfigError, match="rank 0 did not define 'modle'.*model"):
        CellResult.gather(values, CellRequest("", return_names=("modle",)), (0,), 0)


def test_ranks_need_a_live_session_and_must_exist_in_it():
    with pytest.raises(LaunchConfigError, match="--ranks needs a live session"):
        OneShotCells({}).run(CellRequest("x = 1", ranks="0"), {})
    assert parse_ranks("2,0", 4) == (0, 2) and parse_ranks("all", 4) is None and parse_ranks((1,), 2) == (1,)
    with pytest.raises(LaunchConfigError, match="0..1"):
        parse_ranks("5", 2)


def test_a_cell_line_is_parsed_once_and_each_cell_gets_its_own_copy_and_bad_flags_fail_every_time():
    from IPython.core.error import UsageError

    from kernelside.notebook import magics

    line = "-n 2 --return model,losses --timeout 30"
    first = magics._cell_flags(line)
    first.return_names = "changed by the caller"
    again = magics._cell_flags(line)
    assert again is not first and again.return_names == "model,losses" and again.timeout == 30.0
    assert vars(again) == vars(DistributedMagics.distributed.parser.parse_args(line.split()))
    kept = magics._parsed_flags.cache_info().currsize
    for _ in range(2):  # (never kept: the error comes with every run of the cell)
        with pytest.raises(UsageError):
            magics._cell_flags("-n two")
    assert magics._parsed_flags.cache_info().currsize == kept
