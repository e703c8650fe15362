"""The backend protocol: compile (cached by source hash), load the entry point, describe."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, Field

from modulelens.errors import ModuleLensError


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


def default_build_dir() -> Path:
    base = Path(os.environ.get("MODULELENS_BUILD_DIR") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
                / "modulelens" / "build")
    base.mkdir(parents=True, exist_ok=True)
    return base


def get_backend(name: str) -> Backend:
    if name == "cpp":
        from modulelens.kernels.backends.cpp import CppBackend

        return CppBackend()
    if name == "cuda":
        from modulelens.kernels.backends.cuda import CudaBackend

        return CudaBackend()
    if name == "triton":
        from modulelens.kernels.backends.triton import TritonBackend

        return TritonBackend()
    raise ModuleLensError(f"unknown backend {name!r}", "use cpp, cuda or triton")
