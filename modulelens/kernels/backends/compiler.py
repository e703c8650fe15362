"""What the C++ and CUDA backends share about compiling: building an extension with
``torch.utils.cpp_extension.load_inline`` under the build cache's lock with the compiler's output
captured, and turning a compiler log into a short message usable in a repair prompt.

The compiler's output never reaches the process's stdout/stderr: file descriptors 1 and 2 are
redirected into a temporary file during the build (process-wide, hence the lock). A failed build
raises :class:`CompileError` whose message holds the first compiler errors with the build paths
replaced by ``<source>`` (line numbers are those of the candidate's source); the full log is in
``CompileError.log`` and in ``build.log`` in the build folder.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from modulelens.kernels import build_cache
from modulelens.kernels.backends.base import CompileError

# Sources holding this line include their own headers: load_inline puts none in front.
NO_IMPLICIT_HEADERS = "// modulelens: no-implicit-headers"
_BUILD_ERRORS = (RuntimeError, ImportError, OSError, subprocess.SubprocessError)


def build_extension(name: str, folder: Path, lines: dict[str, tuple[int, int]],
                    build: Callable[[], Any]) -> tuple[Any, str]:
    """The extension module ``name``: loaded before in this process, or built now in ``folder`` by
    ``build()`` (a ``load_inline`` call) under the build lock with its output captured.

    ``lines`` is what :func:`summarize_errors` needs to report errors in the candidate's own line
    numbers. Returns (module, build output; empty when it was loaded before). Raises
    :class:`CompileError`, also at once for a source that failed before.
    """
    module = build_cache.loaded(name)
    if module is not None:
        return module, ""
    published = build_cache.published_build(name, f"{name}{LIB_SUFFIX}")
    if published is not None:
        module = import_library(name, published)
        build_cache.remember_loaded(name, module)
        build_cache.remember_build(name, published, fresh=False)
        return module, ""
    folder.mkdir(parents=True, exist_ok=True)
    with build_cache.BUILD_LOCK:
        module = build_cache.loaded(name)
        if module is not None:
            return module, ""
        failure = build_cache.previous_failure(folder)
        if failure is not None:  # the same source failed to compile before: same errors
            raise CompileError(*failure)
        build_cache.clear_stale_lock(folder)
        error: BaseException | None = None
        with captured_output() as box:
            try:
                module = build()
            except _BUILD_ERRORS as e:
                error = e
        log = box[0]
        if error is not None:
            log = f"{error}\n{log}"
            message = summarize_errors(log, lines)
            build_cache.remember_failure(folder, message, log)
            raise CompileError(message, log)
        build_cache.remember_loaded(name, module)
        build_cache.remember_build(name, folder / f"{name}{LIB_SUFFIX}", fresh=True)
    return module, log


LIB_SUFFIX = ".so" if sys.platform != "win32" else ".pyd"


def import_library(name: str, path: Path) -> Any:
    """Import the extension module ``name`` from the built library ``path``."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise CompileError(f"cannot load the published build {path.name}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
        elif _is_header(path):
            where = _short_path(path) + f":{line}"
        else:  # an #include of some other file: its text must not come back in the message
            out.append(f"{_short_path(path)}:{line}: {m.group('kind')}: (not shown: the error is in a file that is "
                       "neither the candidate's source nor a compiler or torch header)")
            if len(out) >= max_errors:
                break
            continue
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
    if _OTHER_FILE.search(log):
        return "build failed (the compiler's output names files outside the candidate's source; not shown)"
    lines = [x for x in log.strip().splitlines() if x.strip() and not x.startswith("[")]
    return "\n".join(_short_path(x) for x in lines[-4:]) or "build failed (no compiler output)"


# "In file included from /etc/x:1", "/etc/x:1:2: note": a path that is no header and no build file
_OTHER_FILE = re.compile(r"(?m)(?:^|\s)(/(?!usr/|opt/)[^\s:]+):\d+")
_HEADER_ROOTS = ("/usr/include", "/usr/lib/gcc", "/usr/local/include", "/usr/local/cuda", "/opt/")


def _is_header(path: str) -> bool:
    """A file of the compiler, the system, CUDA or torch (whose errors may be shown)."""
    import torch

    return (path.startswith(_HEADER_ROOTS) or path.startswith(str(Path(torch.__file__).parent))
            or path.startswith("<") or not path.startswith("/"))


def _short_path(text: str) -> str:
    import torch

    text = text.replace(str(Path(torch.__file__).parent), "<torch>")
    return re.sub(r"/\S*/(main\.cpp|cuda\.cu)", r"<\1>", text)


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
