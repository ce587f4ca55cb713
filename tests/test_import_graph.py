"""kernelside's modules import each other in one direction only: no cycle, lazy imports included."""

from __future__ import annotations

import ast
import os

import pytest

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


# the floors of the house, top down: a module imports only from its own folder or from floors below it.
# worker and display share a floor and never import each other; kernelside's top-level modules are the
# contracts at the bottom (and kernelside/__init__.py, the public names, stands above everything); debugger/ (what
# keeps the kernel's debugger out of the ranks' start, standard library only) sits with them.
FLOORS = (
    ("notebook",),
    ("live",),
    ("launch",),
    ("engines",),
    ("config",),
    ("worker", "display"),
    ("<contracts>", "debugger"),
)


def floor_of(module: str) -> tuple[int, str]:
    """(floor number counted from the top, folder) of a kernelside module.

    >>> floor_of("kernelside.live.session"), floor_of("kernelside.channel")
    ((1, 'live'), (6, '<contracts>'))
    """
    parts = module.split(".")
    in_a_folder = len(parts) > 2 or os.path.isdir(os.path.join(PACKAGE, *parts[1:2]))  # a module or a package
    folder = parts[1] if in_a_folder else "<contracts>"
    return next(i for i, names in enumerate(FLOORS) if folder in names), folder


def imports_running_up(graph: dict[str, set[str]]) -> list[str]:
    """Every import from a lower floor to a higher one, or to a sibling folder on the same floor."""
    out = []
    for name, targets in sorted(graph.items()):
        if name == "kernelside":
            continue
        (floor, folder) = floor_of(name)
        for target in sorted(targets):
            (to_floor, to_folder) = floor_of(target)
            if to_floor < floor or (to_floor == floor and to_folder != folder and folder != "<contracts>"):
                out.append(f"{name} ({folder}) imports {target} ({to_folder})")
    return out


def test_every_import_runs_down_the_house_lazy_imports_included():
    known = modules()
    graph = {name: imports_of(name, path, known) for name, path in known.items()}
    folders = {floor_of(n)[1] for n in known if n != "kernelside"}
    assert folders == {f for names in FLOORS for f in names}  # a new folder must be given its floor
    assert imports_running_up(graph) == []


def test_the_floor_check_reports_an_import_that_runs_up():
    graph = {
        "kernelside.engines.local": {"kernelside.launch.report", "kernelside.channel"},
        "kernelside.display.output": {"kernelside.worker.context"},
        "kernelside.launch.runner": {"kernelside.engines.contract"},
    }
    assert imports_running_up(graph) == [
        "kernelside.display.output (display) imports kernelside.worker.context (worker)",
        "kernelside.engines.local (engines) imports kernelside.launch.report (launch)",
    ]


def test_worker_code_never_imports_the_kernel_side_engine_or_display():
    known = modules()
    for name, path in known.items():
        if name.startswith("kernelside.worker"):
            kernel_side = ("kernelside.launch", "kernelside.display", "kernelside.engines")
            bad = {t for t in imports_of(name, path, known) if t.startswith(kernel_side)}
            assert not bad, f"{name} (runs in the ranks) imports kernel-side modules {bad}"


# -- the Jupyter server never loads torch ---------------------------------------------------------

REPO = os.path.dirname(PACKAGE)
SERVER = os.path.join(REPO, "jupyter_ext")
TORCH = ("torch", "accelerate", "transformers", "lightning", "pytorch_lightning", "deepspeed")  # each loads torch


def server_and_kernel_modules() -> dict[str, str]:
    """``modules()`` plus the server extension's Python modules (``jupyter_ext.runs`` -> file)."""
    out = modules()
    for f in os.listdir(SERVER):
        if f.endswith(".py"):
            out[f"jupyter_ext.{f[:-3]}".removesuffix(".__init__")] = os.path.join(SERVER, f)
    return out


def _executed_nodes(body: list, lazy: bool):
    """The statements that run when a module runs ``body``: function bodies only when ``lazy``."""
    for node in body:
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and not lazy:
            continue
        for child in ast.iter_child_nodes(node):
            yield from _executed_nodes([child], lazy)


def edges_of(name: str, path: str, known: dict, *, lazy: bool) -> set[str]:
    """Modules ``name`` imports: known ones by full name, others by their top-level name (``torch``).

    ``lazy`` includes imports inside functions; without it, only what importing the module runs.
    """
    is_package = path.endswith("__init__.py")
    found = set()
    for node in _executed_nodes(ast.parse(open(path).read()).body, lazy):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = name.split(".") if is_package else name.split(".")[:-1]
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for t in targets:
            while t not in known and "." in t:
                t = t.rsplit(".", 1)[0]
            parts = t.split(".")
            for i in range(1, len(parts) + 1):  # importing a.b.c runs a and a.b first
                found.add(".".join(parts[:i]))
    found.discard(name)
    return found


def path_to(start: str, graph_of, forbidden: tuple[str, ...]) -> list[str] | None:
    """A shortest import path from ``start`` to a forbidden top-level module, or None."""
    seen, todo = {start: None}, [start]
    while todo:
        node = todo.pop(0)
        if node.split(".")[0] in forbidden:
            path = [node]
            while seen[path[-1]] is not None:
                path.append(seen[path[-1]])
            return path[::-1]
        for nxt in sorted(graph_of(node)):
            if nxt not in seen:
                seen[nxt] = node
                todo.append(nxt)
    return None


def server_graph():
    """The server extension's own files with every import (its handlers call their functions); the
    kernelside modules they reach with what importing them runs (a lazy import waits for a call)."""
    known = server_and_kernel_modules()

    def graph_of(node: str) -> set[str]:
        if node not in known:
            return set()  # a third-party module: only its name matters here
        return edges_of(node, known[node], known, lazy=node.startswith("jupyter_ext"))

    return known, graph_of


def test_no_import_path_leads_from_the_server_extension_to_torch():
    known, graph_of = server_graph()
    server = sorted(n for n in known if n.startswith("jupyter_ext"))
    assert {"jupyter_ext.runs", "jupyter_ext.routes", "jupyter_ext.hardware_cache"} <= set(server)
    assert "kernelside.run_contract" in graph_of("jupyter_ext.runs")  # the walk sees the server's edges
    for name in server:
        path = path_to(name, graph_of, TORCH)
        assert path is None, "the Jupyter server would import torch: " + " -> ".join(path)


def test_the_server_imports_only_kernelsides_torch_free_modules():
    known, graph_of = server_graph()
    allowed = ("kernelside.run_contract", "kernelside.nvml_devices", "kernelside.hardware_facts", "kernelside.config")
    allowed += ("kernelside.private_dir",)  # the run-folder base's rules, which kernel and server share
    allowed += ("kernelside.versions",)  # the installed nblaunch's version, which the server reports to the panel
    for name in (n for n in known if n.startswith("jupyter_ext")):
        for target in graph_of(name):
            if target.startswith("kernelside."):
                assert target.startswith(allowed) or target == "kernelside.errors", f"{name} imports {target}"


def test_the_path_finder_reports_a_path_to_torch_it_is_given():
    graph = {"jupyter_ext.runs": {"kernelside.launch.x"}, "kernelside.launch.x": {"torch.cuda"}}
    found = path_to("jupyter_ext.runs", lambda n: graph.get(n, set()), TORCH)
    assert found == ["jupyter_ext.runs", "kernelside.launch.x", "torch.cuda"]
    assert path_to("jupyter_ext.runs", lambda n: graph.get(n, set()) - {"torch.cuda"}, TORCH) is None


@pytest.mark.processes
def test_importing_kernelside_loads_no_torch_yet_guards_cuda_from_then_on_and_every_public_name_works():
    import subprocess
    import sys

    script = (
        "import sys, kernelside\n"
        "print('torch' in sys.modules)\n"
        "import torch\n"  # after kernelside: the guard must be on torch.cuda all the same
        "print(getattr(torch.cuda._lazy_init, '_nblaunch_wrapped', False))\n"
        "print(all(callable(getattr(kernelside, n)) for n in kernelside.__all__))\n"
        "print(kernelside.WorkerError.__module__, issubclass(kernelside.LaunchTimeoutError, kernelside.WorkerError))\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split("\n")[:4] == ["False", "True", "True", "kernelside.errors True"]
