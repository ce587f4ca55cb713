"""Which notebook names a cell or a function needs, and how they reach the ranks: the one place that decides.

Every path that runs notebook code elsewhere asks here:

- a launch (``launch.runner``): a ``Payload`` is the function, its arguments and, for a cell, the
  notebook namespace it reads. Its transport depends on how the ranks start: under fork they
  inherit the notebook itself (``Payload.callable_for("fork")``); otherwise the names the cell reads
  are captured and pickled with it (``Payload.pickled()``), and an unpicklable one is named;
- a live session (``live.names``): the same analysis, sent only when the ranks lack the value;
- export (``notebook.export_deps``): the names become imports, literals, definitions or data.

Two analyses, by purpose: ``names_read`` (bytecode: every global a cell may read, a safe superset,
for what must reach a rank) and ``cell_free_names`` (symtable: names read before the cell binds
them, for the exact text of an exported script). ``NOT_CAPTURED`` and ``RANK_NAMES`` say, once,
which names never travel.

Example::

    >>> sorted(cell_needs("y = lr * 2", {"lr": 0.1, "In": []}))
    ['lr']
"""

from __future__ import annotations

import ast
import dataclasses
import dis
import functools
import symtable
import types

import cloudpickle

from ..errors import LaunchConfigError

# IPython's own names (history, output cache, the shell): they belong to the kernel, never to a rank
NOT_CAPTURED = frozenset(("In", "Out", "get_ipython", "exit", "quit", "_", "__", "___"))
# names every rank defines for itself before user code runs
RANK_NAMES = ("rank", "local_rank", "world_size", "device")


def is_notebook_name(name: str) -> bool:
    """True for a name that may travel from the notebook to a rank (not dunder, IPython's, or a rank's own).

    Example::

        >>> is_notebook_name("model"), is_notebook_name("Out"), is_notebook_name("rank")
        (True, False, False)
    """
    return not name.startswith("__") and name not in NOT_CAPTURED and name not in RANK_NAMES


def is_notebook_function(value) -> bool:
    """A function the notebook itself defined (its globals are the notebook's).

    Example::

        >>> is_notebook_function(len)
        False
    """
    return isinstance(value, types.FunctionType) and value.__module__ == "__main__"


# -- analysis: bytecode (what must reach a rank) ------------------------------------------------------


def names_read(source: str) -> set[str]:
    """Every global name the code (nested functions and classes included) may read.

    Example::

        >>> sorted(names_read("def f():\\n    return lr\\ny = f()"))
        ['f', 'lr', 'y']
    """
    return set(_names_of(source)[0])


def names_assigned(source: str) -> set[str]:
    """The global names a cell binds: top-level assignments, imports, defs, and ``global`` stores.

    Example::

        >>> sorted(names_assigned("import os\\nx = lr\\ndef f():\\n    global g\\n    g = 1"))
        ['f', 'g', 'os', 'x']
    """
    return set(_names_of(source)[1])


@functools.lru_cache(maxsize=64)  # a live session runs the same cell text again and again (a training step)
def _names_of(source: str) -> tuple[frozenset, frozenset]:
    """(names read, names assigned) of ``source``, from one compile of it (keyed by the text alone: a live cell's
    file name changes at every run, its names do not)."""
    read: set[str] = set()
    assigned: set[str] = set()

    def walk(code: types.CodeType, top: bool) -> None:
        read.update(code.co_names)
        for ins in dis.get_instructions(code):
            if ins.opname in ("STORE_GLOBAL", "DELETE_GLOBAL") or (top and ins.opname in ("STORE_NAME", "DELETE_NAME")):
                assigned.add(ins.argval)
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                walk(const, False)

    walk(compile(source, "<nblaunch: the names of a cell>", "exec"), True)
    return frozenset(read), frozenset(assigned)


def function_reads(fn, ns: dict, seen: set[str] | None = None) -> set[str]:
    """The notebook names ``fn`` reads, and those of the notebook functions it calls, by name.

    Example::

        >>> function_reads(lambda: lr * 2, {"lr": 0.1, "other": 1})
        {'lr'}
    """
    seen = set() if seen is None else seen
    stack = [fn.__code__]
    while stack:
        code = stack.pop()
        for name in code.co_names:
            if name in seen or name not in ns:
                continue
            seen.add(name)
            if is_notebook_function(ns[name]):
                stack.append(ns[name].__code__)
        stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    return seen


def cell_needs(source: str, ns: dict) -> set[str]:
    """Every notebook name a cell may read, directly or through the notebook functions it calls."""
    seen = {n for n in names_read(source) if n in ns}
    for name in list(seen):
        if is_notebook_function(ns[name]):
            function_reads(ns[name], ns, seen)
    return {n for n in seen if is_notebook_name(n)}


def function_needs(fn, ns: dict) -> set[str]:
    """The notebook names a function needs on a rank whose namespace is its globals (empty for others).

    Example::

        >>> function_needs(print, {"lr": 0.1})      # not a notebook function: its globals travel with it
        set()
    """
    if not is_notebook_function(fn):
        return set()
    return {n for n in function_reads(fn, ns) if is_notebook_name(n)}


# -- analysis: symtable (what an exported script must define) ------------------------------------


def _global_refs(table: symtable.SymbolTable, top: bool) -> set[str]:
    """Names a scope (and the scopes inside it) reads from module level."""
    out = set()
    for sym in table.get_symbols():
        if sym.is_referenced() and (top or sym.is_global()):
            out.add(sym.get_name())
    for child in table.get_children():
        out |= _global_refs(child, False)
    return out


def cell_free_names(source: str) -> set[str]:
    """Names the cell reads before (or without) binding them itself: those must come from the notebook.

    Example::

        >>> sorted(cell_free_names("y = x + 1\\nprint(y)"))
        ['print', 'x']
    """
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
    for child in table.get_children():
        free |= {n for n in _global_refs(child, False) if n not in first_store}
    return free


def definition_refs(source: str, own_name: str) -> set[str]:
    """The module-level names a function's or class's source reads, itself excepted.

    Example::

        >>> sorted(definition_refs("def train():\\n    return train, lr", "train"))
        ['lr']
    """
    return _global_refs(symtable.symtable(source, "<definition>", "exec"), True) - {own_name}


# -- the payload and its transports ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Payload:
    """What runs on each rank. ``namespace``: the notebook namespace ``fn`` reads (a cell program, which has
    ``source``, ``filename`` and ``with_namespace(ns)``); None for a function, whose globals travel with it.

    Example::

        >>> Payload(len, ("ab",)).callable_for("spawn")
        <built-in function len>
    """

    fn: object
    args: tuple = ()
    kwargs: dict = dataclasses.field(default_factory=dict)
    namespace: dict | None = None
    describe_args: tuple[str, ...] | None = None  # names for args in error messages

    def captured(self) -> dict:
        """The notebook names the cell reads, by value: what a rank that does not inherit the notebook gets."""
        ns, read = self.namespace, names_read(self.fn.source)
        return {n: ns[n] for n in sorted(read) if n in ns and is_notebook_name(n)}

    def callable_for(self, start_method: str):
        """The callable a rank runs: under fork bound to the notebook itself (inherited), else to the captured names."""
        if self.namespace is None:
            return self.fn
        return self.fn.with_namespace(self.namespace if start_method == "fork" else self.captured())

    def pickled(self) -> bytes:
        """The payload for ranks that do not inherit the kernel (spawn): pickled once; what cannot be is named."""
        fn = self.callable_for("spawn")
        try:
            return cloudpickle.dumps((fn, self.args, self.kwargs), protocol=5)
        except Exception as e:
            self._name_unpicklable(fn)
            raise LaunchConfigError(None, None, None, message=f"cannot pickle the launch for spawn: {e}") from None

    def _name_unpicklable(self, fn) -> None:
        if self.namespace is not None:
            problems = []
            for name, value in fn.namespace.items():
                try:
                    cloudpickle.dumps(value)
                except Exception as e:
                    problems.append(f"{name!r} ({type(value).__name__}): {type(e).__name__}: {e}")
            if problems:
                raise unpicklable_names(
                    problems,
                    "spawned workers",
                    "Use fork (--start-method fork, possible while CUDA is not initialized in the kernel), "
                    "or create them inside the %%distributed cell. Nothing was started.",
                )
        parts = [("the function", self.fn)]
        names = self.describe_args or tuple(f"args[{i}]" for i in range(len(self.args)))
        parts += list(zip(names, self.args, strict=True)) + [(f"kwargs[{k!r}]", v) for k, v in self.kwargs.items()]
        for name, obj in parts:
            try:
                cloudpickle.dumps(obj.with_namespace({}) if obj is self.fn and self.namespace is not None else obj)
            except Exception as inner:
                raise LaunchConfigError(
                    name,
                    obj,
                    None,
                    message=f"{name} ({type(obj).__name__}) cannot be sent to spawned workers: "
                    f"{type(inner).__name__}: {inner}. Use start_method='fork' (possible while CUDA is not "
                    "initialized in the kernel), or create that object inside the launched function. "
                    "Nothing was started.",
                ) from None


def unpicklable_names(problems: list[str], to: str, what_to_do: str) -> LaunchConfigError:
    """The error for notebook names that cannot be pickled for ``to``: each name with its reason, then the way out.

    >>> str(unpicklable_names(["'lock' (lock): TypeError: no"], "the live ranks", "Nothing ran."))  # doctest: +ELLIPSIS
    "...these notebook names cannot be sent to the live ranks: 'lock' (lock): TypeError: no. Nothing ran."
    """
    message = f"these notebook names cannot be sent to {to}: " + "; ".join(problems) + ". " + what_to_do
    return LaunchConfigError(None, None, None, message=message)
