"""CPU C++ backend: ``torch.utils.cpp_extension.load_inline``, cached by source hash.

Flags: ``-O3 -march=native -mprefer-vector-width=512 -fopenmp`` on x86-64 Linux (``-mcpu=native``
on ARM, no OpenMP runtime on macOS). ``-march=native`` builds code for this CPU only, so the cache
key includes a fingerprint of the CPU (model and feature flags): a build directory shared between
machines never hands one machine another's binary. Override the architecture flags with
``MODULELENS_CPP_ARCH_FLAGS`` (for example ``"-march=x86-64-v3"``).

Sources are compiled as ``load_inline`` compiles them: ``#include <torch/extension.h>`` is put in
front, unless the source contains the line ``// modulelens: no-implicit-headers`` and includes its
own headers (the templates do: ``<ATen/core/Tensor.h>`` and ``<torch/csrc/utils/pybind.h>`` build
in about half the time of ``torch/extension.h``).

The compiler's output never reaches the process's stdout/stderr: file descriptors 1 and 2 are
redirected into a temporary file during the build (process-wide, so builds are serialised by a
lock). A failed build raises :class:`CompileError` whose message holds the first compiler errors
with the build paths replaced by ``<source>`` (line numbers are those of the candidate's source);
the full log is in ``CompileError.log`` and in ``build.log`` in the build folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from modulelens.kernels.backends.base import BackendStatus, CompileError, default_build_dir

NO_IMPLICIT_HEADERS = "// modulelens: no-implicit-headers"
_BUILD_LOCK = threading.RLock()
_LOADED: dict[str, Any] = {}
_STALE_LOCK_S = 900  # a torch build lock older than this was left by a killed build


# ---------------------------------------------------------------------------------------------
# Shared helpers (used by the cuda backend too)

@contextlib.contextmanager
def captured_output():
    """Redirect file descriptors 1 and 2 (and Python warnings) into a buffer for the duration.
    Yields a list that holds the captured text once the block exits."""
    box: list[str] = []
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    tmp = tempfile.TemporaryFile()
    saved = [os.dup(1), os.dup(2)]
    caught: list[warnings.WarningMessage] = []
    try:
        os.dup2(tmp.fileno(), 1)
        os.dup2(tmp.fileno(), 2)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield box
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])
        tmp.seek(0)
        text = tmp.read().decode(errors="replace")
        tmp.close()
        text += "".join(f"warning: {w.category.__name__}: {w.message}\n" for w in caught)
        box.append(text)


_GCC_ERR = re.compile(r"^(?P<path>[^\s:][^:\n]*?):(?P<line>\d+):(?:(?P<col>\d+):)? (?P<kind>(?:fatal )?error): (?P<msg>.*)$", re.M)
_NVCC_ERR = re.compile(r"^(?P<path>[^\s(][^(\n]*?)\((?P<line>\d+)\): (?P<kind>(?:catastrophic )?error): (?P<msg>.*)$", re.M)
_UNDEFINED = re.compile(r"undefined symbol: (\S+)")


def _demangle(symbol: str) -> str:
    tool = shutil.which("c++filt")
    if not tool:
        return symbol
    try:
        return subprocess.run([tool, symbol], capture_output=True, text=True, timeout=10).stdout.strip() or symbol
    except (OSError, subprocess.SubprocessError):
        return symbol


def summarize_errors(log: str, sources: dict[str, tuple[int, int]], max_errors: int = 3) -> str:
    """The first ``max_errors`` compiler errors of ``log``, short. ``sources`` maps a file's base name
    (``main.cpp``, ``cuda.cu``) to (lines put in front of the candidate's source, its line count):
    errors there are reported as ``<source>:LINE:COL`` in the candidate's numbering (or
    ``<bindings>`` for the generated pybind11 module definition)."""
    hits = sorted([*_GCC_ERR.finditer(log), *_NVCC_ERR.finditer(log)], key=lambda m: m.start())
    out: list[str] = []
    for m in hits:
        path, line = m.group("path").strip(), int(m.group("line"))
        base = os.path.basename(path)
        if base in sources:
            offset, count = sources[base]
            where = f"<source>:{line - offset}" if 0 < line - offset <= count else "<bindings>"
            if line - offset <= 0:
                where = "<implicit headers>"
        else:
            where = _short_path(path) + f":{line}"
        col = m.groupdict().get("col") if where.startswith("<source>") or not where.startswith("<") else None
        text = f"{where}{':' + col if col else ''}: {m.group('kind')}: {m.group('msg').strip()}"
        if text not in out:
            out.append(text)
        if len(out) >= max_errors:
            break
    if out:
        more = len({m.group(0) for m in hits}) - len(out)
        return "\n".join(out) + (f"\n(+{more} more error line(s) in the full log)" if more > 0 else "")
    und = _UNDEFINED.search(log)
    if und:
        return f"load failed: undefined symbol {_demangle(und.group(1))} (declared but never defined?)"
    lines = [x for x in log.strip().splitlines() if x.strip() and not x.startswith("[")]
    return "\n".join(_short_path(x) for x in lines[-4:]) or "build failed (no compiler output)"


def _short_path(text: str) -> str:
    import torch

    text = text.replace(str(Path(torch.__file__).parent), "<torch>")
    return re.sub(r"/\S*/(main\.cpp|cuda\.cu)", r"<\1>", text)


def source_key(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


FAILED = "compile_error.txt"


def remember_failure(folder: Path, message: str, log: str) -> None:
    """Keep the log; remember the failure when the errors are in the candidate's own source (so the
    same source is not compiled again), not when the environment failed (compiler missing, ...)."""
    with contextlib.suppress(OSError):
        (folder / "build.log").write_text(log)
        if "<source>:" in message or "<bindings>" in message:
            (folder / FAILED).write_text(message)


def clear_stale_lock(folder: Path) -> None:
    """torch's FileBaton waits forever on a ``lock`` file left by a build that was killed."""
    lock = folder / "lock"
    with contextlib.suppress(OSError):
        if lock.exists() and time.time() - lock.stat().st_mtime > _STALE_LOCK_S:
            lock.unlink()


@cache
def machine_tag() -> str:
    """Fingerprint of what ``-march=native`` compiles for: architecture, CPU model, CPU features."""
    text = platform.machine() + platform.processor()
    with contextlib.suppress(OSError):
        info = Path("/proc/cpuinfo").read_text().splitlines()
        text += "".join(x for x in info if x.startswith(("model name", "flags", "Features", "CPU part")))[:20000]
    return hashlib.sha256(text.encode()).hexdigest()[:12]


@cache
def compiler_version(cmd: str) -> str:
    exe = shutil.which(cmd)
    if not exe:
        return f"{cmd}: not found"
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return f"{cmd}: {e}"
    lines = [x for x in out.splitlines() if x.strip()]
    release = [x for x in lines if "release" in x]
    return release[0].strip() if release else (lines[0] if lines else cmd)


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
        return ["-O3", *_arch_flags(), *_openmp_flags()[0]]

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

    def _name(self, source: str, entry: str) -> str:
        import torch

        key = source_key("cpp", entry, source, " ".join(self.cflags()), " ".join(self.ldflags()), machine_tag(), torch.__version__)
        return f"ml_cpp_{key[:16]}"

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
        if name in _LOADED:
            return _LOADED[name]
        folder = build_dir / name
        folder.mkdir(parents=True, exist_ok=True)
        implicit = NO_IMPLICIT_HEADERS not in source
        lines = {"main.cpp": (1 if implicit else 0, source.count("\n") + 1)}
        error: BaseException | None = None
        failed = folder / FAILED
        with _BUILD_LOCK:
            if name in _LOADED:
                return _LOADED[name]
            if failed.exists():  # the same source failed to compile before: same errors
                log = (folder / "build.log").read_text() if (folder / "build.log").exists() else ""
                raise CompileError(failed.read_text(), log)
            clear_stale_lock(folder)
            with captured_output() as box:
                try:
                    module = load_inline(
                        name=name, cpp_sources=[source], functions=[entry], build_directory=str(folder),
                        extra_cflags=self.cflags(), extra_ldflags=self.ldflags(), verbose=False,
                        no_implicit_headers=not implicit,
                    )
                except (RuntimeError, ImportError, OSError, subprocess.SubprocessError) as e:
                    error = e
            log = box[0]
            if error is not None:
                log = f"{error}\n{log}"
                message = summarize_errors(log, lines)
                remember_failure(folder, message, log)
                raise CompileError(message, log)
            _LOADED[name] = module
        if not hasattr(module, entry):
            raise CompileError(f"the source defines no `{entry}`", log)
        return module
