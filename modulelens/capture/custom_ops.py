"""Custom operators in exported programs: which modules register them, and importing those first.

A ``torch.export`` program that calls an operator outside torch's own namespaces
(``torch.ops.transformers.grouped_mm_fallback``, a ``torch.library`` op of the user's) can only be
loaded in a process where that operator is registered. At capture time :func:`op_modules` finds,
for every such operator in the program, the modules that register it: the module of its
``torch.library.custom_op`` function, the file its ``torch.library.Library`` was created in, and
otherwise the captured class's own module and the loaded modules of the operator's namespace
package. Before loading, :func:`import_op_modules` imports them; an operator that is still missing
is an error naming it and the module to import. For programs stored without that record,
:func:`missing_ops` reads the operator names from the stored program to say the same.
"""

from __future__ import annotations

import re
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from modulelens.errors import ReplayFailed

TORCH_NAMESPACES = frozenset({"aten", "prim", "prims", "higher_order", "quantized", "_quantized", "rngprims",
                              "debugprims", "profiler", "_c10d_functional", "c10d_functional", "c10d",
                              "_c10d_functional_autograd", "_dtensor", "inductor", "mkldnn", "quantized_decomposed"})
"""Namespaces of operators that ``import torch`` registers."""

_REGISTERED_AT = re.compile(r"^debug: registered at (.+?):\d+\s*$", re.MULTILINE)
_OP_NAME = re.compile(r"torch\.ops\.([A-Za-z_][A-Za-z_0-9]*)\.([A-Za-z_][A-Za-z_0-9]*)")


def graph_ops(program: Any) -> set[str]:
    """``namespace::name`` of every operator outside torch's namespaces that ``program`` (an
    ExportedProgram) calls, nested graphs included."""
    found = set()
    for gm in program.graph_module.modules():
        graph = getattr(gm, "graph", None)
        for node in graph.nodes if isinstance(graph, torch.fx.Graph) else ():
            target = node.target
            if isinstance(target, torch._ops.OpOverload) and target.namespace not in TORCH_NAMESPACES:
                found.add(target._schema.name)
    return found


def _module_of_file(file: str) -> str | None:
    want = Path(file).resolve()
    for name, mod in list(sys.modules.items()):
        path = getattr(mod, "__file__", None)
        if path and name != "__main__" and Path(path).resolve() == want:
            return name
    return None


def _registering_modules(qualname: str) -> list[str]:
    """Modules that registered ``qualname``: its ``custom_op`` function's module, or the module of
    the file where its ``torch.library.Library`` was created."""
    from torch._library.custom_ops import OPDEFS

    opdef = OPDEFS.get(qualname)
    fn = getattr(opdef, "_init_fn", None)
    if fn is not None and getattr(fn, "__module__", None):
        return [fn.__module__]
    try:
        dump = torch._C._dispatch_dump(qualname)
    except RuntimeError:
        return []
    found = []
    for file in _REGISTERED_AT.findall(dump):
        name = _module_of_file(file)
        if name is not None and name.split(".", 1)[0] != "torch" and name not in found:
            found.append(name)
    return found


def op_modules(program: Any, class_module: str) -> dict[str, list[str]]:
    """For every custom operator ``program`` calls: the modules to import before loading it, in
    order (see the module docstring)."""
    out = {}
    for qualname in sorted(graph_ops(program)):
        namespace = qualname.split("::", 1)[0]
        found = _registering_modules(qualname)
        if not found:
            found = [class_module] + sorted(n for n in sys.modules if n.split(".", 1)[0] == namespace)[:3]
        out[qualname] = list(dict.fromkeys(m for m in found if m != "__main__"))
    return out


def is_registered(qualname: str) -> bool:
    namespace, _, name = qualname.partition("::")
    try:
        getattr(getattr(torch.ops, namespace), name)
    except (AttributeError, RuntimeError):
        return False
    return True


def import_op_modules(ops: dict[str, list[str]], load_module: Callable[[str], Any]) -> None:
    """Import the modules recorded for each operator (``load_module`` imports one by name) until it
    is registered. Raises :class:`ReplayFailed` naming the first operator still missing and the
    module to import."""
    for qualname, modules in ops.items():
        errors = []
        for name in modules:
            if is_registered(qualname):
                break
            try:
                load_module(name)
            except Exception as e:  # noqa: BLE001 - reported with the operator it was for
                errors.append(f"importing {name} failed: {str(e).splitlines()[0][:200]}")
        if not is_registered(qualname):
            raise missing_op_error(qualname, modules, errors)


def missing_op_error(qualname: str, modules: list[str], errors: list[str] | None = None) -> ReplayFailed:
    where = f"import {' or '.join(modules)}" if modules else "import the package that defines it"
    said = f" ({'; '.join(errors)})" if errors else ""
    return ReplayFailed(
        f"the exported program calls the custom operator {qualname}, which is not registered in this process{said}",
        f"{where} before replaying (it registered {qualname} at capture time), or use [--strategy source]",
    )


def missing_ops(program_file: Path) -> list[str]:
    """Operators a stored ``.pt2`` program names that are not registered here (read from the
    archive's serialised graphs)."""
    names: set[str] = set()
    with zipfile.ZipFile(program_file) as archive:
        for entry in archive.namelist():
            if entry.endswith(".json"):
                text = archive.read(entry).decode("utf-8", "replace")
                names.update(f"{ns}::{name}" for ns, name in _OP_NAME.findall(text) if ns not in TORCH_NAMESPACES)
    return sorted(n for n in names if not is_registered(n))
