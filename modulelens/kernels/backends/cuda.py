"""CUDA backend: ``load_inline`` with ``cuda_sources`` on a machine with a GPU; compile-checked with
nvcc (and reported as not run) on a machine without one.

With a device, ``load`` builds ``cuda_sources=[source]`` plus ``cpp_sources=[declaration of the
entry point]`` (taken from the source) with ``extra_cuda_cflags=["-O3", "-lineinfo"]``. Not
``--use_fast_math``: it turns ``expf``/``erff``/divisions into approximations whose error grows
with the argument (``__expf`` is off by ~2 + 1.2|x| ulp) and flushes denormals, which fails the
float32 tolerances of validation for softmax and GELU; a candidate that wants the intrinsics calls
``__expf`` and friends explicitly.

Without a device, ``compile_only`` runs nvcc on the same ``cuda.cu`` load_inline would build:
``nvcc -std=c++20 -c -arch=sm_90`` (H100/H200; ``MODULELENS_CUDA_ARCH`` overrides) with torch's
nvcc flags (``-D__CUDA_NO_HALF_OPERATORS__`` ..., ``--expt-relaxed-constexpr``), ``-isystem`` the
torch include directories and the Python include directory, ``-D_GLIBCXX_USE_CXX11_ABI`` as torch
was built, ``-DTORCH_EXTENSION_NAME``/``-DTORCH_API_INCLUDE_EXTENSION_H``. Two shims make the
headers of a CPU-only torch wheel compile, used by ``compile_only`` only: ``-DC10_CUDA_NO_CMAKE_CONFIGURE_FILE``
when ``c10/cuda/impl/cuda_cmake_macros.h`` is missing (it is generated only in CUDA builds of torch),
and a directory of stub ``cusparse.h``/``cublas_v2.h``/``cublasLt.h``/``cusolverDn.h``/``cusolver_common.h``
searched after every other include directory (``-Xcompiler -idirafter``), so that
``ATen/cuda/CUDAContext.h`` compiles where the CUDA toolkit has no cuBLAS/cuSPARSE development
headers. The object is cached by source hash.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from modulelens.errors import ModuleLensError
from modulelens.kernels import build_cache
from modulelens.kernels.backends.base import BackendStatus, CompileError, has_cuda_device
from modulelens.kernels.backends.compiler import (
    NO_IMPLICIT_HEADERS,
    build_extension,
    compiler_version,
    summarize_errors,
)
from modulelens.kernels.build_cache import default_build_dir, source_key

CUDA_FLAGS = ["-O3", "-lineinfo"]
# Prepended to cuda.cu by load_inline unless the source opts out (3 lines: keep in sync with torch).
IMPLICIT_CUDA_HEADERS = ["#include <torch/types.h>", "#include <cuda.h>", "#include <cuda_runtime.h>"]
# torch.utils.cpp_extension.COMMON_NVCC_FLAGS (copied so compile_only needs no CUDA-enabled torch)
COMMON_NVCC_FLAGS = ["-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
                     "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__", "--expt-relaxed-constexpr"]
_STUBS = {
    "cusparse.h": "typedef struct cusparseContext* cusparseHandle_t;\ntypedef int cusparseStatus_t;\n"
                  "inline const char* cusparseGetErrorString(cusparseStatus_t) { return \"\"; }\n",
    "cublas_v2.h": "typedef struct cublasContext* cublasHandle_t;\ntypedef int cublasStatus_t;\n",
    "cublasLt.h": "typedef struct cublasLtContext* cublasLtHandle_t;\n",
    "cusolver_common.h": "typedef int cusolverStatus_t;\n",
    "cusolverDn.h": "#include <cusolver_common.h>\ntypedef struct cusolverDnContext* cusolverDnHandle_t;\n",
}
NO_DEVICE = "no CUDA device on this machine: compile-checked with nvcc, not run"


def _nvcc() -> str | None:
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")):
        if home and (Path(home) / "bin" / "nvcc").exists():
            return str(Path(home) / "bin" / "nvcc")
    return shutil.which("nvcc") or (str(Path("/usr/local/cuda/bin/nvcc")) if Path("/usr/local/cuda/bin/nvcc").exists() else None)


def arch() -> str:
    return os.environ.get("MODULELENS_CUDA_ARCH", "sm_90")


def declaration(source: str, entry: str) -> str:
    """The declaration of ``entry`` (``<return type> entry(<params>);``) from its definition in
    ``source``: the text from the start of the line holding ``entry(`` to the matching ``)``."""
    for m in re.finditer(rf"\b{re.escape(entry)}\s*\(", source):
        depth, i = 0, m.end() - 1
        while i < len(source):
            ch = source[i]
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0:
                break
            i += 1
        rest = source[i + 1:].lstrip()
        if depth or not rest.startswith("{"):
            continue  # a call or a declaration, not the definition
        start = source.rfind("\n", 0, m.start()) + 1
        head = source[start:m.start()].strip()
        if not head or head.startswith(("#", "//")) or head.endswith((";", "=", "return")):
            continue
        if head in ("static", "inline") or head.startswith("static "):
            raise CompileError(f"`{entry}` must have external linkage (not static) to be bound", "")
        return f"{source[start:i + 1].strip()};"
    raise CompileError(
        f"could not find the definition of `{entry}` in the CUDA source",
        "", f"define it at top level, e.g. `at::Tensor {entry}(const at::Tensor& x) {{ ... }}` with the return type on the same line",
    )


def torch_include_flags() -> list[str]:
    import torch
    from torch.utils.cpp_extension import include_paths

    flags: list[str] = []
    for inc in [*include_paths(), sysconfig.get_paths()["include"]]:
        flags += ["-isystem", inc]
    abi = int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))
    flags.append(f"-D_GLIBCXX_USE_CXX11_ABI={abi}")
    if not (Path(include_paths()[0]) / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h").exists():
        flags.append("-DC10_CUDA_NO_CMAKE_CONFIGURE_FILE")  # CPU-only torch wheel
    return flags


class CudaBackend:
    name = "cuda"

    def status(self) -> BackendStatus:
        nvcc = _nvcc()
        if has_cuda_device():
            if nvcc is None:
                return BackendStatus(name=self.name, can_compile=False, can_run=False, can_time=False,
                                     why="a CUDA device but no nvcc: install the CUDA toolkit or set CUDA_HOME")
            return BackendStatus(name=self.name, can_compile=True, can_run=True, can_time=True)
        why = NO_DEVICE if nvcc else "no CUDA device and no nvcc on this machine (set CUDA_HOME or put nvcc on PATH to compile-check)"
        return BackendStatus(name=self.name, can_compile=nvcc is not None, can_run=False, can_time=False, why=why)

    def describe(self) -> dict[str, Any]:
        import torch

        nvcc = _nvcc()
        info: dict[str, Any] = {
            "backend": self.name, "torch": torch.__version__, "torch_cuda": torch.version.cuda,
            "nvcc": compiler_version(nvcc) if nvcc else "not found", "cuda_cflags": CUDA_FLAGS,
            "device": torch.cuda.get_device_name() if has_cuda_device() else None,
        }
        if not has_cuda_device():
            info["compile_only"] = {"arch": arch(), "std": "c++20", "flags": [*COMMON_NVCC_FLAGS, *CUDA_FLAGS]}
        return info

    # -- with a device -------------------------------------------------------------------------
    def build_name(self, source: str, entry: str = "forward") -> str | None:
        """The extension's name and build folder on this device (None without one: compile-only
        builds are not published)."""
        if not has_cuda_device():
            return None
        import torch

        key = source_key("cuda", entry, source, " ".join(CUDA_FLAGS), torch.__version__, str(torch.version.cuda),
                         os.environ.get("TORCH_CUDA_ARCH_LIST", ""), ".".join(map(str, torch.cuda.get_device_capability())),
                         build_cache.torch_location())
        return f"ml_cuda_{key[:16]}"

    def load(self, source: str, entry: str = "forward", build_dir: Path | None = None) -> Callable[..., Any]:
        if not has_cuda_device():
            raise ModuleLensError(NO_DEVICE, "use compile_only here; run CUDA candidates on a machine with a GPU")
        from torch.utils.cpp_extension import load_inline

        build_dir = Path(build_dir) if build_dir else default_build_dir()
        name = self.build_name(source, entry)
        decl = declaration(source, entry)
        implicit = NO_IMPLICIT_HEADERS not in source
        cpp = decl if implicit else "#include <torch/extension.h>\n" + decl
        folder = build_dir / name
        lines = {"cuda.cu": (len(IMPLICIT_CUDA_HEADERS) if implicit else 0, source.count("\n") + 1)}
        module, _ = build_extension(name, folder, lines, lambda: load_inline(
            name=name, cpp_sources=[cpp], cuda_sources=[source], functions=[entry], build_directory=str(folder),
            extra_cflags=["-O3"], extra_cuda_cflags=CUDA_FLAGS, verbose=False, no_implicit_headers=not implicit,
        ))
        return getattr(module, entry)

    # -- without one ---------------------------------------------------------------------------
    def compile_only(self, source: str, build_dir: Path | None = None) -> str:
        import torch

        nvcc = _nvcc()
        if nvcc is None:
            raise ModuleLensError("nvcc not found", "install the CUDA toolkit, set CUDA_HOME or put nvcc on PATH")
        build_dir = Path(build_dir) if build_dir else default_build_dir()
        key = source_key("cuda-compile", source, arch(), " ".join(CUDA_FLAGS), torch.__version__, compiler_version(nvcc))
        name = f"ml_cuda_{key[:16]}"
        folder = build_dir / name
        obj = folder / "cuda.o"
        if obj.exists():
            return f"compiled {name} for {arch()} (cached)"
        failure = build_cache.previous_failure(folder)
        if failure is not None:
            raise CompileError(*failure)
        folder.mkdir(parents=True, exist_ok=True)
        implicit = NO_IMPLICIT_HEADERS not in source
        cu = folder / "cuda.cu"
        cu.write_text("\n".join([*(IMPLICIT_CUDA_HEADERS if implicit else []), source]))
        stubs = self._stubs(build_dir)
        tmp_obj = folder / f"cuda.{os.getpid()}.o.tmp"
        cmd = [nvcc, "-std=c++20", "-c", str(cu), "-o", str(tmp_obj), f"-arch={arch()}", "-Xcompiler", "-fPIC",
               *COMMON_NVCC_FLAGS, *CUDA_FLAGS, *torch_include_flags(), f"-DTORCH_EXTENSION_NAME={name}",
               "-DTORCH_API_INCLUDE_EXTENSION_H", "-Xcompiler", "-idirafter", "-Xcompiler", str(stubs)]
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=folder)
        except subprocess.TimeoutExpired as e:
            raise CompileError("nvcc timed out after 900 s", str(e.stdout or "")) from None
        log = " ".join(cmd) + "\n" + proc.stdout + proc.stderr
        lines = {"cuda.cu": (len(IMPLICIT_CUDA_HEADERS) if implicit else 0, source.count("\n") + 1)}
        if proc.returncode != 0:
            with contextlib.suppress(OSError):
                tmp_obj.unlink()
            message = summarize_errors(log, lines)
            build_cache.remember_failure(folder, message, log)
            raise CompileError(message, log)
        os.replace(tmp_obj, obj)
        (folder / build_cache.BUILD_LOG).write_text(log)
        return f"compiled {name} for {arch()} with nvcc in {time.perf_counter() - t0:.1f} s (compile only, not run)"

    @staticmethod
    def _stubs(build_dir: Path) -> Path:
        folder = build_dir / "_cuda_header_stubs"
        folder.mkdir(parents=True, exist_ok=True)
        for name, body in _STUBS.items():
            path = folder / name
            text = f"#pragma once\n// compile-check stub written by modulelens (never used by load())\n{body}"
            if not path.exists() or path.read_text() != text:
                path.write_text(text)
        return folder

