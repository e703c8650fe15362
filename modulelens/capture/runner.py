"""Run user code with the tracer installed: an unmodified script, a KernelBench-style file, or the
caller's own code (the :func:`capture` context manager)."""

from __future__ import annotations

import ast
import os
import sys
import traceback
import types
from pathlib import Path
from typing import Any

import torch

from modulelens.capture import init_args
from modulelens.capture.artifact import save_capture
from modulelens.capture.manifest import RunSource
from modulelens.capture.tracer import CaptureComplete, CapturedCall, TraceOptions, Tracer
from modulelens.errors import CaptureFailed
from modulelens.repo import Artifact, Repository, validate_name


def is_kernelbench_file(path: Path) -> bool:
    """A file defining ``Model`` and ``get_inputs`` at top level and no ``__main__`` block."""
    try:
        tree = ast.parse(path.read_text(), str(path))
    except SyntaxError:
        return False
    names = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    return {"Model", "get_inputs"} <= names


def _user_frame(exc: BaseException, files: set[str]) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    for fr in reversed(frames):
        if os.path.abspath(fr.filename) in files:
            return f"{Path(fr.filename).name}:{fr.lineno} in {fr.name}"
    if frames:
        fr = frames[-1]
        return f"{fr.filename}:{fr.lineno} in {fr.name}"
    return "unknown location"


def _run_as_main(script: Path, argv: list[str]) -> None:
    """Run a script as ``__main__`` in this (worker) process, as ``python script args`` would."""
    source = script.read_text()
    code = compile(source, str(script), "exec")
    main = types.ModuleType("__main__")
    main.__file__ = str(script)
    main.__builtins__ = __builtins__  # type: ignore[attr-defined]
    sys.modules["__main__"] = main  # stays: classes defined here must remain findable for saving
    sys.argv = [str(script), *argv]
    sys.path.insert(0, str(script.parent))
    exec(code, main.__dict__)


def _load_kernelbench(path: Path) -> types.ModuleType:
    import importlib.util

    mod_name = "modulelens_kb_" + "".join(c if c.isalnum() else "_" for c in path.stem)
    spec = importlib.util.spec_from_file_location(mod_name, path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    mod.__modulelens_by_path__ = True  # type: ignore[attr-defined]
    sys.modules[mod_name] = mod
    spec.loader.exec_module(mod)
    for attr in ("Model", "get_inputs"):
        if not hasattr(mod, attr):
            raise CaptureFailed(f"{path} has no {attr}", "a KernelBench-style file defines Model, get_inputs and get_init_inputs")
    return mod


def _run_kernelbench(path: Path) -> None:
    sys.path.insert(0, str(path.parent))
    mod = _load_kernelbench(path)
    init_inputs = mod.get_init_inputs() if hasattr(mod, "get_init_inputs") else []
    model = mod.Model(*init_inputs)
    inputs = mod.get_inputs()
    with torch.no_grad():
        model(*inputs)


def run_and_capture(
    *,
    script: Path,
    script_args: list[str],
    kind: str,
    options: TraceOptions,
) -> tuple[Tracer, CapturedCall | None, BaseException | None]:
    """Run the user's file with recording and the tracer installed. Returns the tracer, what it
    captured (None if nothing), and the exception the user's code ended with (if any)."""
    init_args.install()
    tracer = Tracer(options).install()
    try:
        error = run_user_file(script, script_args, kind=kind, stop=CaptureComplete)
    finally:
        captured = tracer.finish()
    return tracer, captured, error


def run_user_file(script: Path, script_args: list[str], *, kind: str = "script",
                  stop: type[BaseException]) -> BaseException | None:
    """Run a script (as ``__main__``) or a KernelBench file. Returns the exception the user's code
    ended with, or None when it ended normally, with exit code 0, or through ``stop`` (raised by
    our own hooks to end the run early)."""
    try:
        if kind == "kernelbench":
            _run_kernelbench(script)
        else:
            _run_as_main(script, script_args)
    except stop:
        pass
    except SystemExit as e:
        if e.code not in (0, None):
            return e
    except BaseException as e:  # noqa: BLE001 - reported to the caller with its location
        return e
    return None


def script_error(error: BaseException, script: Path, needed: str = "the target module was captured") -> CaptureFailed:
    """The one-line error for a user script that raised or exited non-zero before ``needed``
    happened (a capture: the target module was captured; statistics: a sampled training step)."""
    if isinstance(error, SystemExit):
        return CaptureFailed(
            f"the script exited with code {error.code} before {needed}",
            "check the script's arguments (pass them after --) and its output",
        )
    where = _user_frame(error, {str(script.resolve())})
    return CaptureFailed(
        f"the script raised {type(error).__name__}: {error} (at {where})",
        f"fix the script or its arguments; the run must go on until {needed}",
    )


def default_name(target: str, script: Path) -> str:
    base = target[5:] if target.startswith("type:") else target
    base = base.replace("*", "x").replace("?", "x").replace("[", "").replace("]", "")
    if not base:
        base = script.stem
    base = "".join(c if (c.isalnum() or c in "_.-") else "-" for c in base).strip(".-") or "capture"
    return base[:100]


class capture:
    """Capture a submodule call from your own code::

        with modulelens.capture("blocks.1", name="blk") as cap:
            model = build_model()      # build inside (or call modulelens.record_constructors() early)
            model(batch)               # the run goes on normally
        print(cap.artifact.ref)

    Constructor arguments are recorded only for modules built while recording is on; a model
    built earlier still captures (export and pickle strategies) and the result says why source
    replay is unavailable.
    """

    def __init__(
        self,
        module: str = "",
        *,
        name: str | None = None,
        repo: str | os.PathLike[str] | None = None,
        call: int = 1,
        backward: bool = False,
        export: bool = True,
        pickle: bool = False,
        max_tensor_bytes: int | None = None,
        max_capture_bytes: int | None = None,
    ):
        from modulelens.repo import default_repo_root

        self.name = validate_name(name) if name else None
        self.repo = Repository(repo if repo is not None else default_repo_root())
        opts = TraceOptions(target=module, call_index=call, backward=backward, export=export, stop=False)
        opts.max_tensor_bytes = max_tensor_bytes
        if max_capture_bytes is not None:
            opts.max_capture_bytes = max_capture_bytes
        self.options = opts
        self.pickle = pickle
        self.tracer: Tracer | None = None
        self.artifact: Artifact | None = None

    def __enter__(self) -> capture:
        self._recording = init_args.recording().__enter__()
        self.tracer = Tracer(self.options).install()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        assert self.tracer is not None
        captured = self.tracer.finish()
        self._recording.__exit__(None, None, None)
        if exc_type is not None:
            return False
        if captured is None:
            raise self.tracer.no_match_error()
        main = sys.modules.get("__main__")
        caller_file = getattr(main, "__file__", None)
        self.artifact = save_capture(
            self.repo,
            self.name or default_name(self.options.target, Path(caller_file or "capture")),
            captured,
            target=self.options.target,
            source=RunSource(kind="api", script=caller_file, argv=list(sys.argv), cwd=os.getcwd()),
            pickle_module=self.pickle,
            extra_sys_path=[os.getcwd(), *([str(Path(caller_file).parent)] if caller_file else [])],
        )
        return False


def record_constructors() -> None:
    """Start recording constructor arguments of every nn.Module built from now on."""
    init_args.install()
