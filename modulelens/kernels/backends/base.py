"""The backend protocol (compile, cached by source hash; load the entry point; describe) and the
table of backends.

The table names each backend's class by module path and is imported only when the backend is
asked for, so this module imports no implementation (the implementations import it).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, Field

from modulelens.errors import ModuleLensError
from modulelens.kernels.build_cache import default_build_dir

__all__ = ["BACKENDS", "Backend", "BackendStatus", "CompileError", "default_build_dir", "get_backend",
           "has_cuda_device"]

# name -> "module:class" of its implementation
BACKENDS: dict[str, str] = {
    "cpp": "modulelens.kernels.backends.cpp:CppBackend",
    "cuda": "modulelens.kernels.backends.cuda:CudaBackend",
    "triton": "modulelens.kernels.backends.triton:TritonBackend",
}


class BackendStatus(BaseModel):
    name: str
    can_compile: bool = Field(description="Sources can be compiled (or, for triton, parsed and jitted) here.")
    can_run: bool = Field(description="Compiled kernels can run here (possibly under an interpreter).")
    can_time: bool = Field(description="Timings here are meaningful for this backend.")
    why: str = Field("", description="What is missing, in words, when something cannot be done.")


class CompileError(ModuleLensError):
    """A candidate that does not compile. ``message`` is short and usable in a repair prompt
    (the first compiler errors, paths trimmed); ``log`` is the full compiler output."""

    def __init__(self, message: str, log: str = "", hint: str | None = None):
        super().__init__(message, hint or "fix the errors above and validate again")
        self.log = log


class Backend(Protocol):
    name: str

    def status(self) -> BackendStatus: ...

    def load(self, source: str, entry: str, build_dir: Path) -> Callable[..., Any]:
        """Compile ``source`` (cached by its hash under ``build_dir``) and return the entry point.
        Raises CompileError."""
        ...

    def compile_only(self, source: str, build_dir: Path) -> str:
        """Compile without loading (for backends that cannot run here); returns a short log.
        Raises CompileError."""
        ...

    def describe(self) -> dict[str, Any]: ...

    def build_name(self, source: str, entry: str = "forward") -> str | None:
        """The name (and shared-cache address) of the library :meth:`load` builds from ``source``,
        computed from the source, entry, flags and environment; None when it builds no library."""
        ...


def has_cuda_device() -> bool:
    """Whether torch sees a CUDA device in this process."""
    import torch

    return torch.cuda.is_available()


def get_backend(name: str) -> Backend:
    """A fresh instance of the backend called ``name`` (see :data:`BACKENDS`)."""
    if name not in BACKENDS:
        raise ModuleLensError(f"unknown backend {name!r}", "use cpp, cuda or triton")
    module, _, cls = BACKENDS[name].partition(":")
    return getattr(importlib.import_module(module), cls)()
