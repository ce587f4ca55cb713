"""Run a notebook cell's code as the launched function, and bring its results back.

``prepare_cell()`` runs in the kernel: it compiles the cell once (so syntax errors, a
top-level ``return`` or ``await`` fail before anything starts), finds its last
expression. ``CellProgram`` is what each worker calls: it executes the cell in the notebook's
namespace (inherited under fork, the names it reads under spawn: ``launch.payload.Payload``)
plus ``rank``, ``local_rank``, ``world_size`` and ``device``, and returns ``CellValues``: the last
expression's value and the ``--return`` names.

Example::

    >>> prog = prepare_cell("x = rank * 2\\nx + 1\\n", cell_label="In[3]", line_offset=1)
    >>> prog.last_expression
    True
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import functools
import linecache
import re
import types

from ..debugger import rank_side
from ..debugger.cell_files import debugged_cell_file
from ..debugger.kernel_proxy import ranks_debugger_address
from ..errors import LaunchConfigError
from ..kernel_shell import running_cell_text
from ..rank_place import cell_file
from ..worker.cell_values import CellValues
from ..worker.context import current as current_worker
from ..worker.results import unwrap_for_return


@dataclasses.dataclass
class CellProgram:
    source: str  # the cell body, padded with line_offset blank lines so line numbers match the cell
    filename: str
    last_expression: bool  # the last statement is an expression whose value is the cell's result
    return_names: tuple[str, ...]
    namespace: dict | None = None  # fork: the notebook's own namespace (inherited); spawn: the names shipped
    debugger: str = ""  # JupyterLab's debugger on: the kernel's address a rank not yet debugged connects to

    @property
    def pickles_plainly(self) -> bool:
        """Plain pickle sends it whole (``live.names.dumps``): text and flags, without a namespace of values."""
        return self.namespace is None

    def with_namespace(self, namespace: dict) -> CellProgram:
        """This program run in ``namespace`` (a copy: the program itself is never changed)."""
        return dataclasses.replace(self, namespace=namespace)

    def __call__(self):
        import torch

        ctx = current_worker()
        ns = self.namespace if self.namespace is not None else {}
        ns.setdefault("__builtins__", builtins)
        ns.update(rank=ctx.rank, local_rank=ctx.local_rank, world_size=ctx.world_size, device=torch.device(ctx.device))
        if self.debugger and not rank_side.debugged():  # (a live rank started before the panel set anything)
            rank_side.connect(self.debugger, ctx.rank)
        lines = self.source.splitlines(keepends=True)
        linecache.cache[self.filename] = (len(self.source), None, lines, self.filename)
        body, last = self._compiled()
        exec(body, ns)
        value = eval(last, ns) if last is not None else None
        returned = {n: unwrap_for_return(ns[n]) for n in self.return_names if n in ns}
        missing = [n for n in self.return_names if n not in ns]
        available = (
            sorted(n for n, v in ns.items() if not n.startswith("_") and not isinstance(v, types.ModuleType))
            if missing
            else []
        )
        return CellValues(unwrap_for_return(value), returned, missing, available)

    def _compiled(self):
        """The cell's code and its last expression's (None without one), compiled once per process and text.

        The cell's file name changes at every run (``In[7]``, then ``In[8]``) while its text often does not (a
        training step run again): the code compiled once is relabelled with this run's name instead of compiled
        again, which costs every rank a fraction of a compile."""
        key = (self.source, self.last_expression)
        got = _COMPILED.get(key)
        if got is None:
            tree = ast.parse(self.source, self.filename)
            last = ast.Expression(tree.body.pop().value) if self.last_expression else None
            got = (compile(tree, self.filename, "exec"), compile(last, self.filename, "eval") if last else None)
            if len(_COMPILED) >= _COMPILED_MAX:
                _COMPILED.pop(next(iter(_COMPILED)))
            _COMPILED[key] = got
        return tuple(None if c is None else _named(c, self.filename) for c in got)


def _named(code: types.CodeType, filename: str) -> types.CodeType:
    """``code`` and the code objects inside it (functions, classes, comprehensions) as compiled from ``filename``."""
    if code.co_filename == filename:
        return code
    consts = tuple(_named(c, filename) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


# Per process on purpose: a live rank runs the same cell text again and again (a training step re-run), and its
# code is the same each time; the oldest goes first past _COMPILED_MAX.
_COMPILED: dict[tuple, tuple] = {}
_COMPILED_MAX = 64
_CALLS_BREAKPOINT = re.compile(r"\bbreakpoint\s*\(")


def _cell_error(message: str) -> LaunchConfigError:
    return LaunchConfigError(None, None, None, message=message + " Nothing was started.")


def prepare_cell(body: str, *, cell_label: str, line_offset: int = 1, return_names=()) -> CellProgram:
    """Check and compile the cell in the kernel; raise LaunchConfigError for what cannot run."""
    filename = cell_file(cell_label)
    # JupyterLab's debugger on: the file its panel knows the cell by
    stops_itself = _CALLS_BREAKPOINT.search(body) is not None  # (it stops in the panel, as a plain cell's)
    debugged = debugged_cell_file(body, running_cell_text(), stops_itself)
    debugger = ""
    if debugged is not None:
        filename, line_offset = debugged
        debugger = ranks_debugger_address(stops_itself)
    source = "\n" * line_offset + body
    last = _checked(source) and not ends_with_semicolon(body)
    return CellProgram(
        source=source, filename=filename, last_expression=last, return_names=tuple(return_names), debugger=debugger
    )


@functools.lru_cache(maxsize=64)  # a live session runs the same cell text again and again (a training step)
def _checked(source: str) -> bool:
    """Raise LaunchConfigError for what cannot run in ``source``; True when its last statement is an expression.
    Keyed by the text alone (a live cell's file name changes at every run; no error message names it)."""
    filename = "<the %%distributed cell>"
    try:
        tree = ast.parse(source, filename)
    except SyntaxError as e:
        hint = ""
        text = (e.text or "").strip()
        if text.startswith(("%", "!")):
            hint = " IPython magics and ! commands cannot run inside a %%distributed cell; run them in their own cell."
        raise _cell_error(
            f"syntax error in the %%distributed cell, line {e.lineno}: {e.msg}: {text!r}.{hint}"
        ) from None
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        if isinstance(node, ast.Return) and _at_top_level(tree, node):
            raise _cell_error(
                f"'return' at the top level of a %%distributed cell (line {node.lineno}) has no function to leave. "
                "The cell's last expression is its result, and --return NAMES brings variables back."
            )
        if isinstance(node, (ast.Await, ast.AsyncFor, ast.AsyncWith)) and _at_top_level(tree, node):
            raise _cell_error(
                f"top-level 'await' (line {node.lineno}) is not supported in a %%distributed cell: each worker runs "
                "the cell as plain Python. Wrap the async code in asyncio.run(main())."
            )
    try:
        compile(tree, filename, "exec")
    except SyntaxError as e:
        raise _cell_error(f"syntax error in the %%distributed cell, line {e.lineno}: {e.msg}.") from None
    return bool(tree.body) and isinstance(tree.body[-1], ast.Expr)


def _at_top_level(tree: ast.Module, target: ast.AST) -> bool:
    """True when ``target`` is not inside any function or class body."""

    def visit(node, nested: bool) -> bool | None:
        if node is target:
            return not nested
        inner = nested or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef))
        for child in ast.iter_child_nodes(node):
            found = visit(child, inner)
            if found is not None:
                return found
        return None

    return bool(visit(tree, False))


def ends_with_semicolon(body: str) -> bool:
    """IPython's rule: a trailing ';' on the last code line hides the cell's result."""
    for line in reversed(body.splitlines()):
        code = line.split("#", 1)[0].strip()
        if code:
            return code.endswith(";")
    return False
