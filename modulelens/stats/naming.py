"""Names of the modules and parameters a statistics run observes.

Modules are named as in ``root.named_modules()`` (wrapper prefixes of DDP/FSDP/``torch.compile``
stripped), the root being the model passed in, or else the first top-level module called that has
parameters (a loss function has none). Modules called inside the model but not registered as
submodules (kept in a plain list, created on the fly) are named after their caller, like
``blocks.0.<ReLU>``. Shared by the collector and the NaN/Inf check of a rerun.
"""

from __future__ import annotations

import weakref

import torch.nn as nn

from modulelens.stats.compiled import dynamo_disabled
from modulelens.wrappers import strip_wrapper_prefix


class ModuleNames:
    """The roots of a run and the names of their modules and parameters; ``notes`` receives the
    note about unregistered modules."""

    def __init__(self, model: nn.Module | None, notes: list[str]):
        self.explicit_root = model is not None
        self.roots: list[nn.Module] = [model] if model is not None else []
        self.notes = notes
        self.compiled = False  # a root is a torch.compile OptimizedModule (and dynamo is on)
        self.param_names: dict[int, tuple[str, str]] = {}  # id(param) -> (name, owner module)
        self.param_shapes: dict[str, list[int]] = {}
        self.tables: set[int] = set()  # id() of embedding tables: their rows are entries, not units
        self._names: dict[int, tuple[weakref.ref, str]] = {}
        self._unnamed: dict[int, tuple[weakref.ref, str]] = {}
        if self.roots:
            self.discover()

    def discover(self) -> None:
        """Name every module and parameter of the roots (the first root's names are bare, the
        others' are prefixed with their class name)."""
        self._names.clear()
        self.param_names.clear()
        self.tables.clear()
        for i, root in enumerate(self.roots):
            prefix = "" if i == 0 else type(root).__name__
            for qual, m in root.named_modules(remove_duplicate=False):
                name = strip_wrapper_prefix(qual)
                if prefix:
                    name = f"{prefix}/{name}" if name else prefix
                if id(m) not in self._names:
                    self._names[id(m)] = (weakref.ref(m), name)
            for m in root.modules():
                if isinstance(m, (nn.Embedding, nn.EmbeddingBag)):
                    self.tables.update(id(p) for p in m.parameters(recurse=False))
            for qual, p in root.named_parameters():
                name = strip_wrapper_prefix(qual)
                owner = name.rsplit(".", 1)[0] if "." in name else ""
                if prefix:
                    name, owner = f"{prefix}/{name}", (f"{prefix}/{owner}" if owner else prefix)
                self.param_names.setdefault(id(p), (name, owner))
                self.param_shapes[name] = list(p.shape)
            if type(root).__name__ == "OptimizedModule" and not dynamo_disabled():
                self.compiled = True

    def lookup(self, module: nn.Module) -> str | None:
        """The name of a module of the roots, else None."""
        entry = self._names.get(id(module))
        if entry is not None and entry[0]() is module:
            return entry[1]
        return None

    def is_root(self, module: nn.Module) -> bool:
        return any(module is r for r in self.roots)

    def adopt_root(self, module: nn.Module) -> bool:
        """A top-level call of an unnamed module: adopt it as a root when it has parameters and no
        model was given. True when adopted."""
        if self.explicit_root or next(module.parameters(), None) is None:
            return False  # a given model, or a loss function or other parameter-free helper
        contained = [r for r in self.roots if any(m is r for m in module.modules())]
        if contained:  # the script called a submodule first; this one holds it: it is the root
            self.roots = [module] + [r for r in self.roots if not any(r is c for c in contained)]
        else:
            self.roots.append(module)
        self.discover()
        return True

    def name_unregistered(self, module: nn.Module, parent: str) -> str:
        """The name of a module called inside ``parent`` but not registered in the roots (given on
        its first call)."""
        entry = self._unnamed.get(id(module))
        if entry is not None and entry[0]() is module:
            return entry[1]
        base = f"{parent}.<{type(module).__name__}>" if parent else f"<{type(module).__name__}>"
        taken = {n for _, n in self._unnamed.values()}
        name, k = base, 2
        while name in taken:
            name, k = f"{base}#{k}", k + 1
        self._unnamed[id(module)] = (weakref.ref(module), name)
        if len(self._unnamed) == 1:
            self.notes.append(
                f"some modules are not registered submodules of the model (e.g. kept in a plain list); "
                f"they are named after their caller, like {name}"
            )
        return name
