"""Triton backend: the candidate is a Python module with ``@triton.jit`` kernels and a ``forward``.

The source is written to ``<build_dir>/ml_triton_<sha16>.py`` (``triton.jit`` reads kernel source
through ``inspect``, which needs a real file) and imported under that name; ``load`` returns its
``forward``. Kernels are compiled by triton at their first launch, so errors in kernel bodies show
up when ``forward`` first runs (:func:`short_error` turns those into a short message).

Without a GPU, correctness runs under triton's interpreter: kernels run in numpy on CPU tensors.
Triton 3.9 reads ``TRITON_INTERPRET`` when ``@triton.jit`` decorates a function (``triton.knobs``,
``runtime.interpret``), so it must be set before the source is executed, not merely before triton
is imported. The sandbox worker sets ``TRITON_INTERPRET=1`` in its environment when there is no
GPU; ``load`` also sets it in ``os.environ`` (process-wide) when there is no GPU and it is unset.
Timing under the interpreter means nothing: ``status().can_time`` is False there.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from modulelens.errors import ModuleLensError
from modulelens.kernels.backends.base import BackendStatus, CompileError, has_cuda_device
from modulelens.kernels.build_cache import default_build_dir

NO_GPU = "no GPU: correctness under TRITON_INTERPRET=1, timing unavailable"
_LOADED: dict[str, Any] = {}


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "yes", "on")


def ensure_interpreter_without_gpu() -> bool:
    """Set ``TRITON_INTERPRET=1`` when there is no GPU and it is not set; returns whether kernels
    defined from now on are interpreted."""
    if not has_cuda_device() and "TRITON_INTERPRET" not in os.environ:
        if "triton.language" in sys.modules:
            # triton's own @jit helpers (tl.sum, tl.max, ...) were defined compiled-mode already
            # (torch imports triton lazily, e.g. when a dispatch mode is first used).
            raise ModuleLensError(
                "triton was imported before TRITON_INTERPRET=1 was set, so its kernels cannot be interpreted "
                "in this process (there is no GPU)",
                "set TRITON_INTERPRET=1 in the environment before starting Python, or validate through the "
                "sandbox (validate-kernel), which does this for you",
            )
        os.environ["TRITON_INTERPRET"] = "1"
    return interpreting()


def short_error(exc: BaseException, path: str | Path | None = None) -> str:
    """One or two lines for an exception raised by a triton candidate: the innermost frame in the
    candidate's file as ``<source>:LINE``, the exception type and the first line of its message."""
    where = ""
    if path is not None:
        for frame in reversed(traceback.extract_tb(exc.__traceback__)):
            if frame.filename == str(path):
                where = f"<source>:{frame.lineno}: "
                break
    if isinstance(exc, SyntaxError) and exc.lineno:
        where = f"<source>:{exc.lineno}:{exc.offset or 0}: "
        return f"{where}SyntaxError: {exc.msg}"
    text = str(exc).strip()
    if path is not None:
        text = text.replace(str(path), "<source>")
    lines = [x for x in text.splitlines() if x.strip()]
    # triton's CompilationError puts the offending kernel line first and the reason last
    detail = lines[-1] if len(lines) > 1 and type(exc).__name__ == "CompilationError" else (lines[0] if lines else "")
    return f"{where}{type(exc).__name__}: {detail}"[:500]


class TritonBackend:
    name = "triton"

    def status(self) -> BackendStatus:
        try:
            import triton  # noqa: F401
        except ImportError as e:
            return BackendStatus(name=self.name, can_compile=False, can_run=False, can_time=False,
                                 why=f"triton is not importable ({e}); pip install triton")
        if has_cuda_device():
            return BackendStatus(name=self.name, can_compile=True, can_run=True, can_time=True)
        return BackendStatus(name=self.name, can_compile=True, can_run=True, can_time=False, why=NO_GPU)

    def describe(self) -> dict[str, Any]:
        import torch

        try:
            import triton

            version = triton.__version__
        except ImportError:
            version = None
        gpu = has_cuda_device()
        return {
            "backend": self.name, "torch": torch.__version__, "triton": version,
            "mode": "gpu" if gpu else "interpreter (TRITON_INTERPRET=1)",
            "device": torch.cuda.get_device_name() if gpu else "cpu (numpy interpreter)",
            "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET"),
        }

    def load(self, source: str, entry: str = "forward", build_dir: Path | None = None) -> Callable[..., Any]:
        module = self._import(source, Path(build_dir) if build_dir else default_build_dir())
        fn = getattr(module, entry, None)
        if not callable(fn):
            raise CompileError(f"the source defines no callable `{entry}`", "", f"define `def {entry}(...)` at module level")
        return fn

    def build_name(self, source: str, entry: str = "forward") -> str | None:
        return None  # Python source: nothing built to share

    def compile_only(self, source: str, build_dir: Path | None = None) -> str:
        self._import(source, Path(build_dir) if build_dir else default_build_dir())
        return "imported (triton compiles each kernel at its first launch)"

    def _import(self, source: str, build_dir: Path) -> Any:
        interpret = ensure_interpreter_without_gpu()
        sha = hashlib.sha256(f"triton\0{source}".encode()).hexdigest()
        name = f"ml_triton_{sha[:16]}"
        key = f"{name}:{int(interpret)}"
        if key in _LOADED:
            return _LOADED[key]
        try:
            code = compile(source, "<source>", "exec")
        except SyntaxError as e:
            raise CompileError(short_error(e), f"{type(e).__name__}: {e}") from None
        del code
        build_dir.mkdir(parents=True, exist_ok=True)
        path = build_dir / f"{name}.py"
        if not path.exists() or path.read_text() != source:
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(source)
            os.replace(tmp, path)
        modname = name if not interpret else f"{name}_interp"
        spec = importlib.util.spec_from_file_location(modname, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[modname] = module
        try:
            spec.loader.exec_module(module)
        except Exception as e:  # noqa: BLE001 - any error in the candidate's module body
            sys.modules.pop(modname, None)
            raise CompileError(short_error(e, path), "".join(traceback.format_exception(e))) from None
        _LOADED[key] = module
        return module
