"""The import graph of ``modulelens/`` has no cycles, tools never import each other, and the
packages form layers: each imports only packages in the layers below its own (:data:`LAYERS`).

Imports inside functions count too: a lazy import only hides a cycle until the day someone
moves it to the top of the file. For the layers, so do string imports: a string constant
that names a modulelens module (``importlib.import_module("modulelens.x")``, an entry point
``"modulelens.x:NAME"``, a module run with ``python -m``).
"""

from __future__ import annotations

import ast
import importlib
import types
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


def imports_in(tree: ast.AST, name: str, package: str, modules: dict[str, Path]) -> set[str]:
    """The modulelens modules that the import statements of ``tree`` (module ``name``, inside
    ``package``) import, those inside functions included."""
    found = set()
    for node in ast.walk(tree):
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
                found.add(owner)
    return found


def import_graph() -> dict[str, set[str]]:
    """module -> the modulelens modules it imports (a package's ``__init__`` is not implied)."""
    modules = _module_names()
    return {name: imports_in(ast.parse(path.read_text(), str(path)), name,
                             name if path.name == "__init__.py" else name.rpartition(".")[0], modules)
            for name, path in modules.items()}


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
    """Tools share code through the packages below them, never through another tool."""
    graph = import_graph()
    offenders = {
        name: sorted(t for t in targets if t.startswith("modulelens.tools."))
        for name, targets in graph.items()
        if name.startswith("modulelens.tools.")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


# -- the layers -------------------------------------------------------------------------------
#
# Every package of modulelens (a top-level module counts as one), top to bottom. A package imports
# only packages in the layers below its own: never one above it, never a sibling in its own layer.
LAYERS: list[tuple[str, ...]] = [
    # The Python API (the package's __init__) and ``python -m modulelens``: nothing imports them.
    ("modulelens", "__main__"),
    # The CLI: its ``mcp`` and ``ui`` commands start the other two front ends.
    ("cli",),
    ("mcp_server", "ui"),
    # What the front ends run on: the job runtime (MCP jobs and the UI's), the sandbox worker's head start.
    ("jobs", "prestart"),
    # One module per tool; a tool never imports another (see above).
    ("tools",),
    # Progress from the lines a user's script prints (over the registry's context).
    ("script_progress",),
    # The registry of tools and the context handed to them: it imports no tool, and nothing below
    # the tools imports it (callbacks come from ``callbacks``).
    ("registry",),
    # Sharing with a team: bundles of captures, packs, reports and statistics.
    ("team",),
    # The tree search (over providers and validation); packs and the guarded dispatch of their kernels.
    ("search", "dispatch"),
    # Validation of a candidate against captured data, in the sandbox; providers of candidates
    # (template, Anthropic, MCP sampling) and the generation of a stored candidate.
    ("validation", "providers"),
    # Backends, templates and stored candidates; fair timing of modules and ops; training statistics.
    ("kernels", "profiling", "stats"),
    # Operator cards and opsets.
    ("ops",),
    # Capture and replay of a module; generic process isolation (it knows nothing of kernels:
    # callers hand it the task runner and the harness by name).
    ("capture", "sandbox"),
    # The launcher of subprocess workers (capture, statistics, run).
    ("workers",),
    # The artifact repository.
    ("repo",),
    # Small shared pieces: argument checks, cancellation, project paths, replies, prompt templates.
    ("arguments", "cancellation", "paths", "replies", "prompts"),
    # Timing with an error bar: a leaf over device and errors.
    ("timing",),
    # Devices: parsing, the "CUDA asked for, none here" policy, synchronisation.
    ("device",),
    # Leaves that import nothing of modulelens.
    ("errors", "callbacks", "faces", "kinds", "listing", "numerics", "wrappers", "version"),
]
_MODULE_STRING = re.compile(r"^modulelens(\.\w+)+(:\w+)?$")


def _string_targets(tree: ast.AST) -> list[str]:
    """Modules named by whole string constants (``"modulelens.x.y"`` or ``"modulelens.x.y:NAME"``)."""
    return [node.value.partition(":")[0] for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and _MODULE_STRING.match(node.value)]


def _package(module: str) -> str:
    """``kernels`` for ``modulelens.kernels.backends.cpp``; a top-level module is its own package,
    the package's ``__init__`` is ``modulelens``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _layer(package: str) -> int | None:
    return next((i for i, layer in enumerate(LAYERS) if package in layer), None)


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
    """``importer -> imported (why)`` for every import that does not run down :data:`LAYERS`."""
    found = []
    for name, targets in sorted(graph.items()):
        package = _package(name)
        for target in sorted(targets):
            other = _package(target)
            if other == package:
                continue
            mine, theirs = _layer(package), _layer(other)
            if mine is None or theirs is None:
                found.append(f"{name} -> {target} ({package if mine is None else other} is in no layer: add it to LAYERS)")
            elif theirs == mine:
                found.append(f"{name} -> {target} ({package} and {other} are siblings in one layer)")
            elif theirs < mine:
                found.append(f"{name} -> {target} ({other} is above {package})")
    return found


def test_every_package_is_in_one_layer():
    packages = {_package(name) for name in _module_names()}
    placed = [p for layer in LAYERS for p in layer]
    assert sorted(p for p in set(placed) if placed.count(p) > 1) == []
    assert sorted(packages - set(placed)) == [], "add these packages to LAYERS"
    assert sorted(set(placed) - packages) == [], "these packages are gone: drop them from LAYERS"


def test_no_package_imports_one_above_it_or_a_sibling():
    assert layering_violations(package_imports()) == []


def test_the_layering_check_sees_lazy_and_string_imports():
    source = ('def check():\n    from modulelens.validation import tasks\n'
              'def templates():\n    return importlib.import_module("modulelens.kernels.templates")\n'
              'RUNNER = "modulelens.validation.checker:RUNNER"\nDOC = "see modulelens.validation for more"\n')
    tree = ast.parse(source)
    assert imports_in(tree, "modulelens.sandbox.worker", "modulelens.sandbox", _module_names()) == {
        "modulelens.validation.tasks"}
    assert sorted(_string_targets(tree)) == ["modulelens.kernels.templates", "modulelens.validation.checker"]
    graph = {"modulelens.sandbox.worker": {"modulelens.validation.tasks", "modulelens.kernels.templates",
                                           "modulelens.cancellation"},
             "modulelens.timing.samples": {"modulelens.errors", "modulelens.repo.store"},
             "modulelens.search.loop": {"modulelens.dispatch.pack", "modulelens.providers.base"},
             "modulelens.gadgets.x": {"modulelens.errors"},
             "modulelens.validation.card": {"modulelens.kernels.backends", "modulelens.sandbox.shm",
                                            "modulelens.validation.report"}}
    assert layering_violations(graph) == [
        "modulelens.gadgets.x -> modulelens.errors (gadgets is in no layer: add it to LAYERS)",
        "modulelens.sandbox.worker -> modulelens.kernels.templates (kernels is above sandbox)",
        "modulelens.sandbox.worker -> modulelens.validation.tasks (validation is above sandbox)",
        "modulelens.search.loop -> modulelens.dispatch.pack (search and dispatch are siblings in one layer)",
        "modulelens.timing.samples -> modulelens.repo.store (repo is above timing)",
    ]


# -- the faces --------------------------------------------------------------------------------
#
# Packages whose ``__init__`` names, in ``__all__``, what other packages may use: a module outside
# such a package imports the package itself, never one of its modules (lazy and string imports
# included), so that the package may move things between its modules without breaking anyone.
FACED = ("capture", "kernels", "ops", "repo", "sandbox", "timing", "validation")


def deep_imports(graph: dict[str, set[str]]) -> list[str]:
    """``importer -> imported`` for every import of a module inside a faced package (:data:`FACED`)
    from outside it."""
    found = []
    for name, targets in sorted(graph.items()):
        for target in sorted(targets):
            other = _package(target)
            if other in FACED and other != _package(name) and target != f"modulelens.{other}":
                found.append(f"{name} -> {target} (import it from modulelens.{other})")
    return found


def test_other_packages_import_only_the_face_of_a_faced_package():
    assert deep_imports(package_imports()) == []


def test_the_face_check_sees_deep_imports_only_from_outside():
    graph = {"modulelens.tools.show": {"modulelens.capture", "modulelens.repo.trust"},
             "modulelens.capture.replay": {"modulelens.capture.spec", "modulelens.repo"},
             "modulelens": {"modulelens.capture.runner"}}
    assert deep_imports(graph) == [
        "modulelens -> modulelens.capture.runner (import it from modulelens.capture)",
        "modulelens.tools.show -> modulelens.repo.trust (import it from modulelens.repo)",
    ]


def test_every_name_of_a_face_resolves():
    for package in FACED:
        face = importlib.import_module(f"modulelens.{package}")
        names = face.__all__
        assert face.__doc__ and len(names) == len(set(names)), package
        assert [n for n in names if not hasattr(face, n)] == [], package
        assert not [n for n in names if isinstance(getattr(face, n), types.ModuleType)], f"{package}: a module is no face"
