"""Find classes again at replay time, including ones defined in a script's ``__main__``.

A class whose module is importable is imported. A class defined in a script (``__main__``) or in a
KernelBench-style file is found in a copy of that file stored with the capture, loaded *for its
definitions only*: if the file has an ``if __name__ == "__main__":`` block, everything except that
block runs (as on import); otherwise only imports, function and class definitions and assignments
without calls run, so a script with top-level training code does not train again on replay.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import sys
import types
from pathlib import Path
from typing import Any

from modulelens.errors import ReplayFailed


def _is_main_guard(node: ast.stmt) -> bool:
    if not isinstance(node, ast.If):
        return False
    t = node.test
    return (
        isinstance(t, ast.Compare)
        and isinstance(t.left, ast.Name)
        and t.left.id == "__name__"
        and len(t.comparators) == 1
        and isinstance(t.comparators[0], ast.Constant)
        and t.comparators[0].value == "__main__"
    )


def _has_call(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Call) for n in ast.walk(node))


def _keep(node: ast.stmt) -> bool:
    if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return True
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        return node.value is None or not _has_call(node.value)
    if isinstance(node, ast.Try):  # try: import x / except ImportError: ...
        return all(_keep(n) for n in node.body)
    if isinstance(node, ast.If):  # if TYPE_CHECKING / version switches around definitions
        return all(_keep(n) for n in node.body + node.orelse)
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):  # docstrings
        return True
    return False


def definitions_source(source: str, filename: str = "<script>") -> str:
    """The part of a script that defines things, without the part that runs things."""
    tree = ast.parse(source, filename)
    if any(_is_main_guard(n) for n in tree.body):
        body = [n for n in tree.body if not _is_main_guard(n)]
    else:
        body = [n for n in tree.body if _keep(n)]
    tree.body = body
    return ast.unparse(tree)


def synthetic_module_name(original: str, source: str) -> str:
    digest = hashlib.sha256(source.encode()).hexdigest()[:10]
    stem = "".join(c if c.isalnum() else "_" for c in original)
    return f"modulelens_src_{stem}_{digest}"


def load_definitions(module_name: str, source: str, filename: str) -> types.ModuleType:
    """Load a script's definitions as a module registered in ``sys.modules[module_name]``."""
    if module_name in sys.modules:
        return sys.modules[module_name]
    code = compile(definitions_source(source, filename), filename, "exec")
    mod = types.ModuleType(module_name)
    mod.__file__ = filename
    sys.modules[module_name] = mod  # dataclasses and pickle look classes up here
    try:
        exec(code, mod.__dict__)
    except Exception as e:
        del sys.modules[module_name]
        raise ReplayFailed(
            f"could not load the definitions of {filename}: {type(e).__name__}: {e}",
            "modulelens runs only imports, definitions and call-free assignments of a script without a "
            "`if __name__ == '__main__':` guard; add such a guard, or move the model into a module",
        ) from e
    return mod


class Resolver:
    """Resolves ``module:qualname`` paths. ``sources`` maps a module name recorded at capture
    (e.g. ``__main__``) to the text and file name of its source, stored with the capture."""

    def __init__(self, sources: dict[str, tuple[str, str]] | None = None, sys_path: list[str] | None = None):
        self.sources = sources or {}
        self.sys_path = [p for p in (sys_path or []) if p]
        self._modules: dict[str, types.ModuleType] = {}

    def module(self, name: str) -> types.ModuleType:
        if name in self._modules:
            return self._modules[name]
        if name in self.sources:
            text, filename = self.sources[name]
            mod = load_definitions(synthetic_module_name(name, text), text, filename)
        else:
            for p in reversed(self.sys_path):
                if p not in sys.path and Path(p).is_dir():
                    sys.path.insert(0, p)
            try:
                mod = importlib.import_module(name)
            except Exception as e:
                raise ReplayFailed(
                    f"cannot import module {name!r}: {type(e).__name__}: {e}",
                    "run replay where the model's code is importable (same environment and working "
                    "directory), or use [--strategy export]",
                ) from e
        self._modules[name] = mod
        return mod

    def __call__(self, path: str) -> Any:
        module_name, _, qualname = path.partition(":")
        if "<locals>" in qualname:
            raise ReplayFailed(
                f"{qualname} is defined inside a function and cannot be imported",
                "define the class at module level, or use [--strategy export]",
            )
        obj: Any = self.module(module_name)
        for part in qualname.split("."):
            try:
                obj = getattr(obj, part)
            except AttributeError as e:
                raise ReplayFailed(
                    f"{module_name} has no attribute {qualname!r}",
                    "the model's code changed since the capture; check out the capture's code version "
                    "or use [--strategy export]",
                ) from e
        return obj
