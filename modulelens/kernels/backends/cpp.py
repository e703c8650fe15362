"""CPU C++ backend: ``torch.utils.cpp_extension.load_inline``, cached by source hash.

Flags: ``-O3 -fno-trapping-math -march=native -mprefer-vector-width=512 -fopenmp`` on x86-64 Linux (``-mcpu=native``
on ARM, no OpenMP runtime on macOS). ``-march=native`` builds code for this CPU only, so the cache
key includes a fingerprint of the CPU (model and feature flags): a build directory shared between
machines never hands one machine another's binary. Override the architecture flags with
``MODULELENS_CPP_ARCH_FLAGS`` (for example ``"-march=x86-64-v3"``). ``-fno-trapping-math``: GCC
if-converts (and so vectorises) loops with the selects of the templates' range-clamped math only
when it may assume floating-point operations do not trap; results are unchanged (IEEE arithmetic,
no fast-math): only floating-point exception flags, which nothing here reads, may differ. Without
it the softmax template ran at 0.33x of eager on [64, 1024] at one thread, with it 1.1x.

Sources are compiled as ``load_inline`` compiles them: ``#include <torch/extension.h>`` is put in
front, unless the source contains the line ``// modulelens: no-implicit-headers`` and includes its
own headers (the templates do: ``<ATen/core/Tensor.h>`` and ``<torch/csrc/utils/pybind.h>`` build
in about half the time of ``torch/extension.h``).

Builds go through :func:`modulelens.kernels.backends.compiler.build_extension`: the compiler's
output is captured, never printed, and a failed build raises a short :class:`CompileError`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import shlex
import shutil
import sys
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from modulelens.kernels import build_cache
from modulelens.kernels.backends.base import BackendStatus, CompileError
from modulelens.kernels.backends.compiler import NO_IMPLICIT_HEADERS, build_extension, compiler_version
from modulelens.kernels.build_cache import default_build_dir, source_key


@cache
def machine_tag() -> str:
    """Fingerprint of what ``-march=native`` compiles for: architecture, CPU model, CPU features."""
    text = platform.machine() + platform.processor()
    with contextlib.suppress(OSError):
        info = Path("/proc/cpuinfo").read_text().splitlines()
        text += "".join(x for x in info if x.startswith(("model name", "flags", "Features", "CPU part")))[:20000]
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _arch_flags() -> list[str]:
    env = os.environ.get("MODULELENS_CPP_ARCH_FLAGS")
    if env is not None:
        return shlex.split(env)
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64"):
        return ["-march=native", "-mprefer-vector-width=512"]
    if machine in ("aarch64", "arm64"):
        return ["-mcpu=native"]
    return []


def _openmp_flags() -> tuple[list[str], list[str]]:
    if sys.platform == "darwin":  # Apple clang has no OpenMP runtime; keep the simd pragmas
        return ["-fopenmp-simd"], []
    return ["-fopenmp"], ["-fopenmp"]


# ---------------------------------------------------------------------------------------------

class CppBackend:
    name = "cpp"

    def cflags(self) -> list[str]:
        return ["-O3", "-fno-trapping-math", *_arch_flags(), *_openmp_flags()[0]]

    def ldflags(self) -> list[str]:
        return _openmp_flags()[1]

    def status(self) -> BackendStatus:
        from torch.utils.cpp_extension import is_ninja_available

        cxx = os.environ.get("CXX", "c++")
        missing = [what for what, ok in ((f"a C++ compiler ({cxx})", shutil.which(cxx)), ("ninja", is_ninja_available())) if not ok]
        if missing:
            why = "missing " + " and ".join(missing) + ": install them (e.g. apt-get install g++; pip install ninja)"
            return BackendStatus(name=self.name, can_compile=False, can_run=False, can_time=False, why=why)
        return BackendStatus(name=self.name, can_compile=True, can_run=True, can_time=True)

    def describe(self) -> dict[str, Any]:
        import torch

        return {
            "backend": self.name, "torch": torch.__version__, "compiler": compiler_version(os.environ.get("CXX", "c++")),
            "cflags": self.cflags(), "ldflags": self.ldflags(), "openmp": "-fopenmp" in self.cflags(),
            "machine": f"{platform.machine()} {machine_tag()}", "threads": torch.get_num_threads(),
            "builder": "torch.utils.cpp_extension.load_inline (ninja)",
        }

    def build_name(self, source: str, entry: str = "forward") -> str:
        """The extension's name and build folder: a hash of the source, entry, flags, CPU and torch
        (the checker computes it too, to find and publish the build)."""
        import torch

        key = source_key("cpp", entry, source, " ".join(self.cflags()), " ".join(self.ldflags()), machine_tag(), torch.__version__,
                         build_cache.torch_location())
        return f"ml_cpp_{key[:16]}"

    _name = build_name

    def load(self, source: str, entry: str = "forward", build_dir: Path | None = None) -> Callable[..., Any]:
        module = self._build(source, entry, Path(build_dir) if build_dir else default_build_dir())
        return getattr(module, entry)

    def compile_only(self, source: str, build_dir: Path | None = None) -> str:
        name = self._name(source, "forward")
        t0 = time.perf_counter()
        self._build(source, "forward", Path(build_dir) if build_dir else default_build_dir())
        return f"compiled {name} ({time.perf_counter() - t0:.1f} s, cached by source hash)"

    def _build(self, source: str, entry: str, build_dir: Path) -> Any:
        from torch.utils.cpp_extension import load_inline

        name = self._name(source, entry)
        folder = build_dir / name
        implicit = NO_IMPLICIT_HEADERS not in source
        lines = {"main.cpp": (1 if implicit else 0, source.count("\n") + 1)}
        module, log = build_extension(name, folder, lines, lambda: load_inline(
            name=name, cpp_sources=[source], functions=[entry], build_directory=str(folder),
            extra_cflags=self.cflags(), extra_ldflags=self.ldflags(), verbose=False, no_implicit_headers=not implicit,
        ))
        if not hasattr(module, entry):
            raise CompileError(f"the source defines no `{entry}`", log)
        return module
