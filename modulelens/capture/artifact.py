"""Write a captured call into the repository as a ``captures`` artifact, and read it back.

Files of a capture version::

    manifest.json            what was captured, how to rebuild it, sha256 of every file
    inputs.safetensors       positional and keyword inputs (shape-only ones omitted)
    outputs.safetensors      outputs of the real forward
    state.safetensors        inputs and buffers the forward changed, as they were after it
    weights.safetensors      parameters and buffers as they were before the forward
    init.safetensors         tensors passed to constructors (when any)
    rng.safetensors          RNG states just before the call
    grads.safetensors        gradients (when backward was captured)
    program.pt2              torch.export program (when export succeeded)
    module.pkl               pickled module (only when asked for)
    sources/<n>.py           copies of scripts whose classes live in ``__main__`` or a loaded file
"""

from __future__ import annotations

import os
import platform
import socket
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from modulelens.capture.manifest import (
    KIND,
    SCHEMA,
    BackwardInfo,
    CallInputs,
    CaptureEnvironment,
    CaptureManifest,
    DistributedInfo,
    ExportInfo,
    RunSource,
    StoredSource,
)
from modulelens.capture.numerics import current_settings
from modulelens.capture.spec import ModuleSpec
from modulelens.capture.spec_walk import referenced_modules
from modulelens.capture.tracer import CapturedCall
from modulelens.capture.values import class_path
from modulelens.device import processor_name
from modulelens.repo import Artifact, Repository


def _save_tensors(folder: Path, filename: str, tensors: dict[str, torch.Tensor]) -> None:
    """Save ``tensors`` by key; tensors sharing memory (one gradient reaching an input and the
    output unchanged) are saved once each: safetensors refuses shared storage."""
    if tensors:
        seen: set[tuple[int, int]] = set()
        dense = {}
        for k, v in tensors.items():
            v = v.contiguous()
            where = (v.untyped_storage().data_ptr(), v.storage_offset()) if v.numel() else (id(v), 0)
            dense[k] = v.clone() if where in seen else v
            seen.add(where)
        save_file(dense, str(folder / filename))


def _save_program(program: torch.export.ExportedProgram, path: Path) -> None:
    """Save ``program`` without the data of its parameters and buffers (on the meta device): the
    capture's weights file holds them once; replay fills them from it."""
    kept = dict(program.state_dict)
    try:
        for key, t in kept.items():
            meta = torch.empty_like(t, device="meta")
            program.state_dict[key] = torch.nn.Parameter(meta, t.requires_grad) if isinstance(t, torch.nn.Parameter) else meta
        torch.export.save(program, str(path))
    finally:
        program.state_dict.update(kept)


def load_tensors(artifact: Artifact, filename: str) -> dict[str, torch.Tensor]:
    """The tensors of one stored file, each in memory of its own as torch's allocator aligns it:
    safetensors may hand out tensors at any byte offset, and BLAS kernels can round differently on
    unaligned memory, so a replay on the loaded tensors would not be bit for bit."""
    if not artifact.has_file(filename):
        return {}
    return {k: v.clone() for k, v in load_file(str(artifact.file(filename))).items()}


def _file_backed_modules(names: set[str]) -> dict[str, str]:
    """Modules that cannot be imported by name later (a script's ``__main__``, files loaded by
    path): map module name -> file whose copy is stored with the capture."""
    out = {}
    for name in names:
        mod = sys.modules.get(name)
        file = getattr(mod, "__file__", None)
        if not file or not file.endswith(".py"):
            continue
        if name == "__main__" or name.startswith("modulelens_kb_") or getattr(mod, "__modulelens_by_path__", False):
            out[name] = file
    return out


def _import_roots(names: set[str]) -> list[str]:
    """Folders from which the given modules import by name (``/p`` for ``a.b`` at ``/p/a/b.py``),
    so that replay in a fresh process finds them whatever ``sys.path`` the capture had."""
    roots = []
    for name in sorted(names):
        mod = sys.modules.get(name)
        file = getattr(mod, "__file__", None)
        if not file or name == "__main__":
            continue
        path = Path(file).resolve()
        up = len(name.split(".")) + (1 if path.name == "__init__.py" else 0)
        root = path.parents[up - 1] if up - 1 < len(path.parents) else None
        if root is not None and "site-packages" not in root.parts and str(root) not in roots:
            roots.append(str(root))
    return roots


def _replay_strategies(captured: CapturedCall, init_spec: ModuleSpec | None,
                       pickle_module: bool) -> tuple[list[str], list[str]]:
    """The replay strategies a capture supports, in auto order, and notes on those it does not."""
    cls_path = class_path(captured.module)
    notes: list[str] = []
    strategies = []
    if init_spec is None:
        notes.append(
            f"constructor arguments of {cls_path} were not recorded (the module was built before "
            "recording started); source replay is unavailable"
        )
    elif "<locals>" in cls_path:
        notes.append(f"{cls_path} is defined inside a function; source replay is unavailable")
    elif any("source" in u.blocks for u in captured.unrecorded):
        read = ", ".join(u.path for u in captured.unrecorded if "source" in u.blocks)
        notes.append(f"the captured call reads or takes values that could not be recorded ({read}); "
                     "source replay is unavailable")
    elif init_spec.bind_error:
        notes.append(f"constructor arguments did not bind to the signature: {init_spec.bind_error}")
    else:
        strategies.append("source")
    if captured.program is not None:
        strategies.append("export")
    elif captured.export_error:
        notes.append(f"torch.export failed: {captured.export_error}")
    if pickle_module:
        strategies.append("pickle")
    return strategies, notes


def _save_grads(folder: Path, captured: CapturedCall) -> BackwardInfo | None:
    """Write the captured gradients; None when backward was not captured."""
    if captured.grad_output is None:
        return None
    grads: dict[str, torch.Tensor] = {}
    for prefix, seq in (("grad_output", captured.grad_output), ("grad_input", captured.grad_input or [])):
        for i, g in enumerate(seq):
            if g is not None:
                grads[f"{prefix}.{i}"] = g.detach().cpu()
    for pname, g in captured.param_grads.items():
        grads[f"param.{pname}"] = g.detach().cpu()
    _save_tensors(folder, "grads.safetensors", grads)
    return BackwardInfo(
        grad_output=[g is not None for g in captured.grad_output],
        grad_input=[g is not None for g in (captured.grad_input or [])],
        param_grads=sorted(captured.param_grads),
    )


def _save_sources(folder: Path, file_modules: dict[str, str]) -> dict[str, StoredSource]:
    """Copy the files of modules that cannot be imported by name later into ``sources/``."""
    sources = {}
    if file_modules:
        (folder / "sources").mkdir()
        for i, (mod_name, file) in enumerate(sorted(file_modules.items())):
            rel = f"sources/{i}_{Path(file).name}"
            (folder / rel).write_text(Path(file).read_text())
            sources[mod_name] = StoredSource(file=rel, original=os.path.abspath(file))
    return sources


def _environment(captured: CapturedCall) -> CaptureEnvironment:
    device = next((spec.get("device", "cpu") for spec in captured.weight_specs.values()), "cpu")
    return CaptureEnvironment(
        torch=torch.__version__,
        python=platform.python_version(),
        platform=platform.platform(),
        host=socket.gethostname(),
        device=device,
        num_threads=torch.get_num_threads(),
        processor=processor_name(device),
        numerics=current_settings(),
    )


def save_capture(
    repo: Repository,
    name: str,
    captured: CapturedCall,
    *,
    target: str,
    source: RunSource,
    pickle_module: bool = False,
    extra_sys_path: list[str] | None = None,
    distributed: DistributedInfo | None = None,
) -> Artifact:
    """Store ``captured`` as a new version of the capture ``name``: its tensors, gradients, export
    program, optional pickle and script copies, and a :class:`CaptureManifest` describing them."""
    module = captured.module
    init_spec, init_sink = captured.init_spec, captured.init_sink
    strategies, notes = _replay_strategies(captured, init_spec, pickle_module)
    notes += captured.backward_notes
    cls_path = class_path(module)
    modules = (referenced_modules(init_spec.to_json()) if init_spec is not None else set()) | {cls_path.split(":", 1)[0]}
    file_modules = _file_backed_modules(modules)
    shape_only = captured.inputs_sink.shape_only + captured.outputs_sink.shape_only + captured.state_sink.shape_only

    shape_only += sorted(captured.weights_shape_only)
    notes += captured.notes
    notes += [f"memory shared in the {what} is not rebuilt: {line}"
              for what, sink in (("inputs", captured.inputs_sink), ("outputs", captured.outputs_sink))
              for line in sink.relations.lost]
    if captured.weights_storage is not None and captured.weights_storage.mode != "full":
        notes.append(captured.weights_storage.reason)

    def write(folder: Path) -> CaptureManifest:
        _save_tensors(folder, "inputs.safetensors", captured.inputs_sink.tensors)
        _save_tensors(folder, "outputs.safetensors", captured.outputs_sink.tensors)
        _save_tensors(folder, "state.safetensors", captured.state_sink.tensors)
        _save_tensors(folder, "weights.safetensors", captured.weights)
        _save_tensors(folder, "init.safetensors", init_sink.tensors)
        _save_tensors(folder, "rng.safetensors", captured.rng)
        backward = _save_grads(folder, captured)
        if captured.program is not None:
            _save_program(captured.program, folder / "program.pt2")
        if pickle_module:
            torch.save(module, str(folder / "module.pkl"))
        inputs = CallInputs(args=captured.args_spec, kwargs=captured.kwargs_spec)
        return CaptureManifest(
            module_path=captured.module_path,
            class_path=cls_path,
            target=target,
            call_index=captured.call_index,
            strategies=strategies,
            init=init_spec,
            inputs=inputs,
            outputs=captured.outputs_spec,
            weights=captured.weight_specs,
            training=captured.training,
            grad_enabled=captured.grad_enabled,
            autocast=captured.autocast,
            forward_seconds=captured.forward_seconds,
            export=ExportInfo(
                ok=captured.program is not None, error=captured.export_error, seconds=round(captured.export_seconds, 4),
                calling="leaves", input_keys=[t.key for t in inputs.tensor_leaves()],
                returned_keys=captured.returned_keys, custom_ops=captured.custom_ops,
                weights="separate" if captured.program is not None else "embedded",
            ),
            state_after=captured.state_sink.specs,
            activations=captured.activations,
            weights_storage=captured.weights_storage,
            backward=backward,
            shape_only=shape_only,
            unrecorded=[u.text() for u in captured.unrecorded],
            unrecorded_values=captured.unrecorded,
            attributes=captured.attributes,
            notes=notes,
            source=source,
            sources=_save_sources(folder, file_modules),
            sys_path=list(dict.fromkeys([*(p for p in (extra_sys_path or []) if p), *_import_roots(modules)])),
            distributed=distributed,
            environment=_environment(captured),
            input_tensors=len(inputs.tensor_leaves()),
        )

    return repo.create(KIND, name, write, schema_version=SCHEMA)
