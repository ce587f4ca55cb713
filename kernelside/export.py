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
import builtins
import dataclasses
import datetime
import importlib
import inspect
import linecache
import pickle
import shlex
import symtable
import textwrap
import types
from pathlib import Path

from . import hardware
from .config import resolve_config
from .errors import LaunchConfigError
from .plan import accelerate_env

DEFAULT_PORT = 29500
WORKER_NAMES = ("rank", "local_rank", "world_size", "device")
_SKIP = {"In", "Out", "get_ipython", "exit", "quit", "_", "__", "___"}
_LITERAL_MAX = 2000  # longer literals go into the pickle instead of the script text


@dataclasses.dataclass
class CellRecord:
    """The last ``%%distributed`` cell: its body and the flags it was run with."""

    body: str
    label: str
    arguments: dict
    config: str | None = None


_last_cell: list[CellRecord] = []


def remember_cell(record: CellRecord) -> None:
    _last_cell[:] = [record]


def last_cell() -> CellRecord | None:
    return _last_cell[0] if _last_cell else None


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


def _global_refs(table: symtable.SymbolTable, top: bool) -> set[str]:
    """Names a scope (and the scopes inside it) reads from module level."""
    out = set()
    for sym in table.get_symbols():
        if not sym.is_referenced():
            continue
        if top or sym.is_global():
            out.add(sym.get_name())
    for child in table.get_children():
        out |= _global_refs(child, False)
    return out


def _nested_refs(table: symtable.SymbolTable) -> set[str]:
    out = set()
    for child in table.get_children():
        out |= _global_refs(child, False)
    return out


def cell_free_names(source: str) -> set[str]:
    """Names the cell reads before (or without) binding them itself: those must come from the notebook."""
    tree = ast.parse(source)
    first_store: dict[str, int] = {}
    first_load: dict[str, int] = {}
    for i, stmt in enumerate(tree.body):
        for node in ast.walk(stmt):
            if isinstance(node, ast.Name):
                target = first_load if isinstance(node.ctx, ast.Load) else first_store
                target.setdefault(node.id, i)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                first_store.setdefault(node.name, i)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    first_store.setdefault((alias.asname or alias.name).split(".")[0], i)
    table = symtable.symtable(source, "<cell>", "exec")
    free = {n for n, i in first_load.items() if i <= first_store.get(n, len(tree.body))}
    # Functions defined in the cell read globals when called: notebook names unless the cell binds them.
    free |= {n for n in _nested_refs(table) if n not in first_store}
    return free


def definition_refs(source: str, own_name: str) -> set[str]:
    table = symtable.symtable(source, "<definition>", "exec")
    return _global_refs(table, True) - {own_name}


def _function_source(fn) -> str | None:
    try:
        return textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        return None


def _class_source(cls, user_ns: dict) -> str | None:
    """A notebook class's source: inspect cannot find it (``__main__`` has no file in a kernel)."""
    try:
        return textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        pass
    for value in vars(cls).values():
        fn = getattr(value, "__func__", None) or getattr(value, "fget", None) or value
        code = getattr(fn, "__code__", None)
        if code is None:
            continue
        found = _class_in_text("".join(linecache.getlines(code.co_filename)), cls.__name__, code.co_firstlineno)
        if found:
            return found
    for text in reversed(user_ns.get("In") or []):  # a class without methods: the last cell that defined it
        found = _class_in_text(text, cls.__name__, None)
        if found:
            return found
    return None


def _class_in_text(text: str, name: str, line: int | None) -> str | None:
    if not text:
        return None
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    lines = text.splitlines(keepends=True)
    for node in reversed(tree.body):
        if isinstance(node, ast.ClassDef) and node.name == name:
            if line is not None and not (node.lineno <= line <= node.end_lineno):
                continue
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            return "".join(lines[start - 1 : node.end_lineno])
    return None


def _literal(value) -> str | None:
    """Source text for a small plain value, or None."""
    if isinstance(value, (bool, int, float, str, bytes, type(None), tuple, list, dict, set, frozenset)):
        try:
            text = repr(value)
            if len(text) <= _LITERAL_MAX and ast.literal_eval(text) == value:
                return text
        except (ValueError, SyntaxError, TypeError, RecursionError):
            return None
    return None


def _import_line(name: str, value) -> str | None:
    if isinstance(value, types.ModuleType):
        mod = value.__name__
        if mod == "__main__":
            return None
        return f"import {mod}" if mod == name else f"import {mod} as {name}"
    mod, qual = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    if not mod or not qual or mod == "__main__" or "<" in qual or "." in qual:
        return None
    try:
        if getattr(importlib.import_module(mod), qual) is not value:
            return None
    except Exception:
        return None
    return f"from {mod} import {qual}" if qual == name else f"from {mod} import {qual} as {name}"


class _MainRecorder(pickle.Pickler):
    """A pickler that notes which notebook classes and functions the data refers to by name."""

    def __init__(self, file):
        super().__init__(file, protocol=4)
        self.main_objects: dict[str, object] = {}

    def reducer_override(self, obj):
        for candidate in (obj, type(obj)):
            if isinstance(candidate, (type, types.FunctionType)) and candidate.__module__ == "__main__":
                self.main_objects[candidate.__qualname__] = candidate
        return NotImplemented


class _Collector:
    """Walks from the names the code uses to everything the script must define."""

    def __init__(self, user_ns: dict):
        self.ns = user_ns
        self.seen: set[str] = set()
        self.imports: list[str] = []
        self.literals: list[tuple[str, str]] = []
        self.definitions: list[tuple[str, str]] = []  # (name, source), each after what it uses
        self.data: dict[str, object] = {}
        self.notes: list[str] = []

    def visit(self, names) -> None:
        for name in sorted(names):
            if name in self.seen or name in _SKIP or name in WORKER_NAMES or name.startswith("__"):
                continue
            if name not in self.ns:
                continue  # a builtin, or a name the code defines itself
            if getattr(builtins, name, None) is self.ns[name]:
                continue
            self.seen.add(name)
            self._one(name, self.ns[name])

    def _one(self, name: str, value) -> None:
        line = _import_line(name, value)
        if line is not None:
            self.imports.append(line)
            return
        is_main = getattr(value, "__module__", None) == "__main__"
        if is_main and isinstance(value, types.FunctionType) and value.__name__ != "<lambda>":
            source = _function_source(value)
            if source is not None and value.__name__ == name:
                self._define(name, source)
                return
        if is_main and isinstance(value, type):
            source = _class_source(value, self.ns)
            if source is not None and value.__name__ == name:
                self._define(name, source)
                return
        text = _literal(value)
        if text is not None:
            self.literals.append((name, text))
            return
        self.data[name] = value

    def _define(self, name: str, source: str) -> None:
        try:
            refs = definition_refs(source, name)
        except SyntaxError:
            refs = set()
        self.visit(refs)
        self.definitions.append((name, source.rstrip() + "\n"))

    def pickle_data(self) -> bytes | None:
        """Pickle the data; notebook classes it refers to become definitions too (repeat until stable)."""
        import io

        while True:
            good, recorded = {}, {}
            for name, value in list(self.data.items()):
                buf = io.BytesIO()
                rec = _MainRecorder(buf)
                try:
                    rec.dump(value)
                except Exception as e:
                    self.data.pop(name)
                    self.notes.append(
                        f"{name!r} ({type(value).__name__}) could not be saved with pickle: {type(e).__name__}: {e}. "
                        f"Define {name} in the script before running it."
                    )
                    continue
                good[name] = value
                recorded.update(rec.main_objects)
            missing = {q for q in recorded if "." not in q and q not in self.seen}
            for q in missing:
                self.ns.setdefault(q, recorded[q])
            if not missing:
                return pickle.dumps(good, protocol=4) if good else None
            self.visit(missing)


# -- the script ---------------------------------------------------------------------------------

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
_init_process_group = dist.init_process_group


def _init_once(*args, **kwargs):  # code that calls init_process_group() itself keeps working
    if not dist.is_initialized():
        _init_process_group(*args, **kwargs)


dist.init_process_group = _init_once
"""


def _split_last_expression(body: str) -> tuple[str, str | None]:
    """(code before the last expression, the last expression's source) — as the notebook shows it."""
    tree = ast.parse(body)
    if not tree.body or not isinstance(tree.body[-1], ast.Expr) or _ends_with_semicolon(body):
        return body, None
    last = tree.body[-1]
    lines = body.splitlines(keepends=True)
    head = "".join(lines[: last.lineno - 1]) + lines[last.lineno - 1][: last.col_offset]
    return head, ast.get_source_segment(body, last.value)


def _ends_with_semicolon(body: str) -> bool:
    for line in reversed(body.splitlines()):
        code = line.split("#", 1)[0].strip()
        if code:
            return code.endswith(";")
    return False


def _commands(values: dict, script: str, gpus: int) -> tuple[str, str]:
    machines = values["num_machines"]
    total = values["num_processes"]
    if total is None:
        per_node: int | str = "gpu" if gpus else 2
        total_acc = (gpus or 2) * machines
    else:
        if total % machines:
            raise LaunchConfigError(
                "num_processes",
                total,
                None,
                message=f"num_processes={total} is the total over num_machines={machines} machines and must divide "
                f"evenly among them. Set num_processes to a multiple of {machines}. Nothing was written.",
            )
        per_node, total_acc = total // machines, total
    ip = values["main_process_ip"]
    if ip is None:
        if machines > 1:
            raise LaunchConfigError(
                "main_process_ip",
                None,
                None,
                message=f"num_machines={machines} needs main_process_ip, the address of machine 0 that every "
                "machine can reach. Set it in the panel or nblaunch.yaml. Nothing was written.",
            )
        ip = "127.0.0.1"
    port = values["main_process_port"] or DEFAULT_PORT
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
    col = _Collector(user_ns)
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
        "dist.destroy_process_group()",
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
