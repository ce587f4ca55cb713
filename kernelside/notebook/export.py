"""Export a ``%%distributed`` cell or a notebook function as a standalone script for ``torchrun``.

The script carries what the code uses from the notebook: imports become import lines,
notebook functions and classes are written out from their source (and whatever they use in
turn), small literals are written as they are, and other data goes into ``NAME.data.pkl``
beside the script (or, when it cannot be pickled, a note in the script and in the export
says so). The script sets the process group up from the variables ``torchrun`` and
``accelerate launch`` set, and defines ``rank``, ``local_rank``, ``world_size`` and
``device`` as the cell had them. Rank 0 prints the repr of the cell's last expression (or
of the function's return value), as the notebook showed it.

The commands use the same ``nblaunch.yaml`` (and the cell's flags) as the launch did:
``--nnodes`` from ``num_machines``, ``--nproc-per-node`` from ``num_processes``, and a c10d
rendezvous at ``main_process_ip:main_process_port``.

Example::

    >>> ex = export_function("train.py", train, args=(0.1,), user_ns=globals())   # doctest: +SKIP
    >>> print(ex.torchrun)
    torchrun --nnodes 1 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:29500 train.py
"""

from __future__ import annotations

import ast
import dataclasses
import datetime
import pickle
import shlex
from pathlib import Path

from ..config import resolve_config
from ..config.launch_rules import DEFAULT_PORT, processes_per_machine
from ..errors import LaunchConfigError
from ..launch import hardware
from ..launch.payload import cell_free_names
from ..launch.plan import accelerate_env
from .cell import ends_with_semicolon
from .export_deps import Collector


@dataclasses.dataclass
class CellRecord:
    """The last ``%%distributed`` cell: its body and the flags it was run with."""

    body: str
    label: str
    arguments: dict
    config: str | None = None


class _LastCell:
    record: CellRecord | None = None


# Global on purpose: %distributed_export exports "the last %%distributed cell of this kernel", whichever
# magic instance or API call ran it; a kernel is one process.
LAST_CELL = _LastCell()


def remember_cell(record: CellRecord) -> None:
    """Keep ``record`` as the cell ``%distributed_export`` exports by default."""
    LAST_CELL.record = record


def last_cell() -> CellRecord | None:
    """The last ``%%distributed`` cell that ran in this kernel, or None."""
    return LAST_CELL.record


@dataclasses.dataclass
class ExportedScript:
    """What an export wrote and how to run it."""

    path: Path
    data_path: Path | None
    torchrun: str
    accelerate: str
    notes: list[str]

    def __str__(self) -> str:
        lines = [f"wrote {self.path}" + (f" and {self.data_path}" if self.data_path else "")]
        lines += [f"note: {n}" for n in self.notes]
        lines += ["run it with torchrun (on every machine):", f"  {self.torchrun}"]
        lines += ["or with Accelerate:", f"  {self.accelerate}"]
        return "\n".join(lines)

    __repr__ = __str__


# -- what the code uses from the notebook -------------------------------------------------------


_PREAMBLE = """\
# Process group and worker names, as nblaunch set them up in the notebook.
import os
import pickle

import torch
import torch.distributed as dist

rank = int(os.environ["RANK"])  # set by torchrun / accelerate launch
local_rank = int(os.environ["LOCAL_RANK"])
world_size = int(os.environ["WORLD_SIZE"])
_use_cpu = {use_cpu!r} or not torch.cuda.is_available()
device = torch.device("cpu") if _use_cpu else torch.device("cuda", local_rank % torch.cuda.device_count())
_backend = {backend!r}
if _backend == "auto":
    _own_gpu = not _use_cpu and torch.cuda.device_count() >= int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    _backend = "nccl" if _own_gpu else "gloo"
if device.type == "cuda":
    torch.cuda.set_device(device)
for _key, _value in {env!r}.items():
    os.environ.setdefault(_key, _value)
if _use_cpu:
    os.environ.setdefault("ACCELERATE_USE_CPU", "true")
dist.init_process_group(_backend)
# gloo can return from init on one rank while a peer is still connecting: meet once first
dist.barrier(device_ids=[device.index]) if _backend == "nccl" else dist.barrier()
_init_process_group = dist.init_process_group


def _init_once(*args, **kwargs):  # code that calls init_process_group() itself keeps working
    if not dist.is_initialized():
        _init_process_group(*args, **kwargs)


dist.init_process_group = _init_once


# The end, as a normal exit would end (exit handlers run, files still open flushed), but without the
# interpreter's teardown: a DDP model still holding the process group can make torch 2.13's gloo abort there
# ("terminate called without an active exception"), and torchrun would report the run as failed.
def _leave():
    import atexit
    import gc
    import io

    atexit._run_exitfuncs()
    for _obj in gc.get_objects():
        if isinstance(_obj, (io.TextIOWrapper, io.BufferedWriter, io.BufferedRandom)) and not _obj.closed:
            try:
                _obj.flush()
            except Exception:
                pass
    os._exit(0)
"""


def _split_last_expression(body: str) -> tuple[str, str | None]:
    """(code before the last expression, the last expression's source) — as the notebook shows it."""
    tree = ast.parse(body)
    if not tree.body or not isinstance(tree.body[-1], ast.Expr) or ends_with_semicolon(body):
        return body, None
    last = tree.body[-1]
    lines = body.splitlines(keepends=True)
    head = "".join(lines[: last.lineno - 1]) + lines[last.lineno - 1][: last.col_offset]
    return head, ast.get_source_segment(body, last.value)


def _commands(values: dict, script: str, gpus: int) -> tuple[str, str]:
    machines = values["num_machines"]
    per_node = processes_per_machine(values, gpus, doing="Nothing was written.")
    ip = values["main_process_ip"] or "127.0.0.1"  # (more than one machine needs it: checked above)
    port = values["main_process_port"] or DEFAULT_PORT
    total_acc = per_node * machines
    if values["num_processes"] is None and gpus:
        per_node = "gpu"  # torchrun's own: one process per GPU of the machine it runs on
    q = shlex.quote
    torchrun = (
        f"torchrun --nnodes {machines} --nproc-per-node {per_node} --rdzv-backend c10d "
        f"--rdzv-endpoint {ip}:{port} {q(script)}"
    )
    acc = ["accelerate launch"]
    if total_acc > 1:
        acc.append("--multi_gpu")
    acc.append(f"--num_processes {total_acc} --num_machines {machines}")
    if machines > 1:
        acc.append("--machine_rank $MACHINE_RANK")
    acc.append(f"--main_process_ip {ip} --main_process_port {port} --rdzv_backend c10d")
    acc.append(f"--mixed_precision {values['mixed_precision']}")
    if values["gpu_ids"] != "all":
        acc.append(f"--gpu_ids {values['gpu_ids']}")
    acc.append(q(script))
    if machines > 1:
        torchrun += "   # the same on every machine"
    return torchrun, " ".join(acc)


def _write(
    path,
    code_names: set[str],
    user_ns: dict,
    body_lines: list[str],
    values: dict,
    origin: str,
) -> ExportedScript:
    path = Path(path)
    if path.suffix != ".py":
        raise LaunchConfigError("NAME.py", str(path), "a file name ending in .py, e.g. train.py")
    col = Collector(user_ns)
    col.visit(code_names)
    blob = col.pickle_data()
    data_path = path.with_name(path.stem + ".data.pkl") if blob is not None else None
    torchrun, accelerate = _commands(values, path.name, hardware.gpu_count())

    use_cpu = bool(values["use_cpu"])
    env = {str(k): str(v) for k, v in values["env"].items()}
    env.update(accelerate_env(values, use_cpu))
    env.pop("ACCELERATE_USE_CPU", None)  # decided where the script runs, by the preamble
    out = [
        f'"""{origin}, exported by nblaunch on {datetime.date.today().isoformat()}.',
        "",
        "Run with torchrun:",
        f"    {torchrun}",
        "or with Accelerate:",
        f"    {accelerate}",
        '"""',
        _PREAMBLE.format(use_cpu=use_cpu, backend=values["backend"], env=env),
    ]
    imports = sorted(set(col.imports) - {"import torch", "import torch.distributed as dist", "import os"})
    if imports:
        out += ["# -- imports from the notebook", *imports, ""]
    if col.literals:
        out += ["# -- values from the notebook", *(f"{n} = {t}" for n, t in col.literals), ""]
    for name, source in col.definitions:
        out += [f"# -- {name}, from the notebook", source]
    if data_path is not None:
        out += [
            f"# -- data from the notebook ({', '.join(sorted(pickle.loads(blob)))}), saved beside this script",
            f"with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), {data_path.name!r}), 'rb') as _fh:",
            "    _data = pickle.load(_fh)",
            *(f"{n} = _data[{n!r}]" for n in sorted(pickle.loads(blob))),
            "",
        ]
    for note in col.notes:
        out.append(f"# NOTE: {note}")
    out += ["", *body_lines, ""]
    out += [
        "if rank == 0 and _result is not None:",
        "    print(repr(_result))",
        "# every rank is past its last collective before any tears its connections down",
        "dist.barrier(device_ids=[device.index]) if _backend == 'nccl' else dist.barrier()",
        "dist.destroy_process_group()",
        "_leave()",
        "",
    ]
    path.write_text("\n".join(out))
    if data_path is not None:
        data_path.write_bytes(blob)
    return ExportedScript(path, data_path, torchrun, accelerate, col.notes)


def export_cell(path, record: CellRecord, user_ns: dict) -> ExportedScript:
    """Write ``record``'s cell as a script; see the module docstring."""
    cfg = resolve_config(record.arguments, config=record.config)
    head, last = _split_last_expression(record.body)
    body = [f"# -- the %%distributed cell {record.label}", head.rstrip("\n")]
    body.append(f"_result = ({last})" if last is not None else "_result = None")
    return _write(path, cell_free_names(record.body), user_ns, body, cfg.values, f"%%distributed cell {record.label}")


def export_function(
    path, fn, *, args=(), kwargs=None, user_ns: dict, arguments: dict | None = None, config=None
) -> ExportedScript:
    """Write ``fn(*args, **kwargs)`` as a script; ``fn`` must be defined in (or imported into) the notebook.

    Example::

        >>> export_function("train.py", train, args=(0.1,), user_ns=get_ipython().user_ns)   # doctest: +SKIP
    """
    name = getattr(fn, "__name__", None)
    if not callable(fn) or not name or user_ns.get(name) is not fn:
        raise LaunchConfigError(
            "function",
            fn,
            None,
            message=f"{fn!r} is not a function the notebook defines under its own name; export a notebook "
            "function by name (%distributed_export train.py train). Nothing was written.",
        )
    cfg = resolve_config(arguments or {}, config=config)
    ns = dict(user_ns)
    ns["_args"], ns["_kwargs"] = tuple(args), dict(kwargs or {})
    body = [f"# -- run {name} on every rank", f"_result = {name}(*_args, **_kwargs)"]
    return _write(path, {name, "_args", "_kwargs"}, ns, body, cfg.values, f"{name}() from the notebook")
