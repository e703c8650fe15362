"""The import graph of ``modulelens/`` has no cycles, tools never import each other, and no
package imports one it must not (the layering rules below).

Imports inside functions count too: a lazy import only hides a cycle until the day someone
moves it to the top of the file. For the layering rules, so do string imports: a string constant
that names a modulelens module (``importlib.import_module("modulelens.x")``, an entry point
``"modulelens.x:NAME"``, a module run with ``python -m``).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "modulelens"


def _module_names() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _owner(name: str, modules: dict[str, Path]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    """module -> the modulelens modules it imports (a package's ``__init__`` is not implied)."""
    modules = _module_names()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*up, base] if base else up)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for target in targets:
                owner = _owner(target, modules) if target.startswith("modulelens") else None
                if owner and owner != name:
                    graph[name].add(owner)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycles():
    assert _cycles(import_graph()) == []


def test_the_checker_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_tools_never_import_each_other():
    graph = import_graph()
    offenders = {
        name: sorted(t for t in targets if t.startswith("modulelens.tools."))
        for name, targets in graph.items()
        if name.startswith("modulelens.tools.")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


# -- layering between packages ----------------------------------------------------------------
#
# timing is a leaf: it imports nothing of modulelens but the leaf modules in LEAVES.
# sandbox is generic isolation: it imports neither kernels nor validation (its callers tell it
#   which task runner a worker runs and which harness a candidate process runs).
# validation may import kernels, sandbox, timing, ops, capture, repo; kernels does not import it.
# profiling imports neither kernels nor validation (the profile tool times candidates).
# jobs is the job runtime below the front ends: the MCP server and the UI import it, never the reverse.
LEAVES = {"modulelens.errors", "modulelens.device"}
FORBIDDEN = {
    "jobs": {"mcp_server", "ui", "cli"},
    "sandbox": {"kernels", "validation"},
    "kernels": {"validation"},
    "profiling": {"kernels", "validation"},
}
_MODULE_STRING = re.compile(r"^modulelens(\.\w+)+(:\w+)?$")


def _string_targets(tree: ast.AST) -> list[str]:
    """Modules named by whole string constants (``"modulelens.x.y"`` or ``"modulelens.x.y:NAME"``)."""
    return [node.value.partition(":")[0] for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and _MODULE_STRING.match(node.value)]


def _package(module: str) -> str:
    """``kernels`` for ``modulelens.kernels.backends.cpp``; a top-level module is its own package."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def package_imports() -> dict[str, set[str]]:
    """module -> the modulelens modules it imports, string imports included."""
    modules = _module_names()
    graph = import_graph()
    for name, path in modules.items():
        for target in _string_targets(ast.parse(path.read_text(), str(path))):
            owner = _owner(target, modules)
            if owner and owner != name:
                graph[name].add(owner)
    return graph


def layering_violations(graph: dict[str, set[str]]) -> list[str]:
    """``importer -> imported`` for every import the rules above forbid."""
    found = []
    for name, targets in graph.items():
        package = _package(name)
        for target in sorted(targets):
            other = _package(target)
            if other == package:
                continue
            if package == "timing" and target not in LEAVES:
                found.append(f"{name} -> {target} (timing is a leaf)")
            elif other in FORBIDDEN.get(package, set()):
                found.append(f"{name} -> {target} ({package} must not import {other})")
    return found


def test_no_package_imports_one_it_must_not():
    assert layering_violations(package_imports()) == []


def test_the_layering_check_sees_lazy_and_string_imports():
    tree = ast.parse('def f():\n    importlib.import_module("modulelens.kernels.templates")\n'
                     'RUNNER = "modulelens.validation.tasks:RUNNER"\nDOC = "see modulelens.validation for more"\n')
    assert sorted(_string_targets(tree)) == ["modulelens.kernels.templates", "modulelens.validation.tasks"]
    graph = {"modulelens.sandbox.worker": {"modulelens.validation.tasks"},
             "modulelens.timing.samples": {"modulelens.errors", "modulelens.repo.store"},
             "modulelens.profiling.targets": {"modulelens.profiling.bandwidth", "modulelens.kernels.candidates"},
             "modulelens.validation.card": {"modulelens.kernels.backends", "modulelens.sandbox.shm"}}
    assert layering_violations(graph) == [
        "modulelens.sandbox.worker -> modulelens.validation.tasks (sandbox must not import validation)",
        "modulelens.timing.samples -> modulelens.repo.store (timing is a leaf)",
        "modulelens.profiling.targets -> modulelens.kernels.candidates (profiling must not import kernels)",
    ]


def test_registry_imports_no_tool():
    assert not any(t.startswith("modulelens.tools") for t in import_graph()["modulelens.registry"])
