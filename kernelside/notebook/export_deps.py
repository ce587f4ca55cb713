"""The export transport of notebook names: for each name an exported script uses (which ones:
``launch.payload``), an import line, a literal, the source of a notebook function or class (and
what that uses in turn), or a value for the data pickle.

Example::

    >>> col = Collector({"lr": 0.1, "np": numpy})       # doctest: +SKIP
    >>> col.visit({"lr", "np"}); col.imports, col.literals   # doctest: +SKIP
    (['import numpy as np'], [('lr', '0.1')])
"""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import linecache
import pickle
import textwrap
import types

from ..launch.payload import definition_refs, is_notebook_name

_LITERAL_MAX = 2000  # longer literals go into the pickle instead of the script text


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


class Collector:
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
            if name in self.seen or not is_notebook_name(name):
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
