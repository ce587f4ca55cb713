"""kernelside's modules import each other in one direction only: no cycle, lazy imports included."""

from __future__ import annotations

import ast
import os

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "kernelside")


def modules() -> dict[str, str]:
    """Module name (``kernelside.launch.runner``) -> file, for every module of the package."""
    out = {}
    root = os.path.dirname(PACKAGE)
    for folder, _, files in os.walk(PACKAGE):
        for f in files:
            if f.endswith(".py"):
                name = os.path.relpath(os.path.join(folder, f), root)[:-3].replace(os.sep, ".")
                out[name.removesuffix(".__init__")] = os.path.join(folder, f)
    return out


def imports_of(name: str, path: str, known: dict) -> set[str]:
    """Every kernelside module ``name`` imports anywhere in its file (inside functions too)."""
    is_package = path.endswith("__init__.py")
    found = set()
    for node in ast.walk(ast.parse(open(path).read())):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = name.split(".") if is_package else name.split(".")[:-1]
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for t in targets:
            while t and t not in known and "." in t:
                t = t.rsplit(".", 1)[0]
            if t in known and t not in (name, "kernelside"):
                found.add(t)
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_kernelside_has_no_import_cycle_lazy_imports_included():
    known = modules()
    graph = {name: imports_of(name, path, known) for name, path in known.items()}
    assert len(graph) > 30 and graph["kernelside.launch.runner"]  # the walk sees the package and its edges
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_reports_a_cycle_it_is_given():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_worker_code_never_imports_the_kernel_side_engine_or_display():
    known = modules()
    for name, path in known.items():
        if name.startswith("kernelside.worker"):
            kernel_side = ("kernelside.launch", "kernelside.display", "kernelside.engines")
            bad = {t for t in imports_of(name, path, known) if t.startswith(kernel_side)}
            assert not bad, f"{name} (runs in the ranks) imports kernel-side modules {bad}"
