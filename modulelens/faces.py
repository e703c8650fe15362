"""A package's public face whose names are imported on first use (PEP 562).

A package whose modules are costly to import (torch) or that is imported one module at a time
(a worker or a sandboxed candidate needs one module of it, not all) writes its face in its
``__init__`` as a table and hands it to :func:`lazy_face`::

    __all__ = [...]                      # the names other packages may import
    __getattr__, __dir__ = lazy_face(__name__, {"Name": "module", "Alias": "module:name"})

``from package import Name`` then imports ``package.module`` (and only it) the first time. The
face binds nothing on the package: each look-up reads the module's current attribute, so a name
patched where it is defined (a test's monkeypatch) is what a caller's later import gets.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable


def lazy_face(package: str, table: dict[str, str]) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``, whose face maps each public name to the
    submodule that defines it (``"module"``) or to a name there (``"module:name"``)."""

    def __getattr__(name: str) -> object:
        where = table.get(name)
        if where is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attribute = where.partition(":")
        return getattr(importlib.import_module(f"{package}.{module}"), attribute or name)

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(table))

    return __getattr__, __dir__
