"""The extensions a module candidate builds itself with ``torch.utils.cpp_extension.load_inline``,
shared between its validations through the build cache like card candidates' builds.

In the candidate's process, :func:`route_load_inline` (installed before its source runs) sends
each ``load_inline`` call through the shared cache; the checker finds what was built fresh at the
address it computes itself (:func:`module_build_address`) and publishes it once verified (see
:mod:`modulelens.kernels.build_cache`). Calls of ``torch.utils.cpp_extension.load`` (sources read
from files) are not routed: they build in the candidate's own folder every time.
"""

from __future__ import annotations

import inspect
import os
import platform
import sys
from pathlib import Path
from typing import Any

import torch

from modulelens.kernels import build_cache
from modulelens.kernels.backends.compiler import LIB_SUFFIX, compiler_version, import_library
from modulelens.kernels.backends.cpp import machine_tag
from modulelens.kernels.build_cache import published_build, remember_build, source_key


def environment_parts() -> list[str]:
    """What a build's binary depends on besides its own inputs: torch, Python, CUDA, the C++
    compiler and the CPU (``-march=native``)."""
    return [torch.__version__, str(torch.version.cuda), sys.version, platform.machine(), machine_tag(),
            compiler_version(os.environ.get("CXX", "c++")), build_cache.torch_location()]


def module_build_address(module_source: str, extension: str) -> str:
    """The address of the extension ``extension`` that a module candidate with ``module_source``
    builds (with ``load_inline``): the same source builds the same extension, so only candidates
    with exactly this source share it."""
    return "ml_mod_" + source_key("module", module_source, extension, *environment_parts())[:24]


def route_load_inline(module_source: str, build_root: Path) -> None:
    """(In a module candidate's process, before its source runs) make
    ``torch.utils.cpp_extension.load_inline`` go through the shared cache: an extension whose
    address (:func:`module_build_address` of this source and the extension's name) is published
    with a matching checksum is imported from there; any other is built as asked, but in
    ``build_root/<address>`` (the checker looks for it there, and publishes it once verified).
    Only Python-module builds are routed; anything else goes to load_inline untouched."""
    import torch.utils.cpp_extension as ext

    original = ext.load_inline
    signature = inspect.signature(original)

    def load_inline(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        name = bound.arguments.get("name")
        if not isinstance(name, str) or not name.isidentifier() or not bound.arguments.get("is_python_module", True):
            return original(*args, **kwargs)
        address = module_build_address(module_source, name)
        filename = f"{name}{LIB_SUFFIX}"
        found = published_build(address, filename)
        if found is not None:
            module = import_library(name, found)
            remember_build(name, found, fresh=False)
            return module
        folder = build_root / address
        folder.mkdir(parents=True, exist_ok=True)
        bound.arguments["build_directory"] = str(folder)
        module = original(*bound.args, **bound.kwargs)
        remember_build(name, folder / filename, fresh=True)
        return module

    ext.load_inline = load_inline
