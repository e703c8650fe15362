"""What an LLM provider is asked for a module-level candidate (a ``ModelNew`` for a whole captured
module), and how that request is read off a capture.

:func:`describe_capture` reads what the prompt shows: the class's source (its stored copy for a
script's classes, else the source of the importable class; only its ``forward`` when the class is
very long), ``forward``'s signature, the constructor arguments, the call's inputs and outputs
(shapes and dtypes) and the parameters and buffers by name. Reading the class imports its module,
so the capture must be trusted (as for replay); without the class the prompt says the source is
not available and keeps the rest.
"""

from __future__ import annotations

import inspect
from typing import Any

from pydantic import BaseModel, Field

from modulelens.capture.manifest import CaptureManifest, capture_manifest
from modulelens.capture.spec import mapping_items, sequence_items
from modulelens.kernels.module_candidates import ModuleCandidate
from modulelens.providers.values import describe_value
from modulelens.repo import Artifact

MAX_CLASS_CHARS = 12000
MAX_WEIGHT_LINES = 60


class ModuleRequest(BaseModel):
    """One ModelNew asked of a provider for the capture ``capture``."""

    capture: str = Field(description="The capture ref (name:vN).")
    class_path: str
    module_path: str = ""
    training: bool = Field(False, description="Captured in training mode: the candidate must be correct there too.")
    class_source: str | None = Field(None, description="The class's source, when readable and not too long.")
    forward_source: str | None = Field(None, description="forward's source, when the class's is not given.")
    signature: str = "(...)"
    construction: list[str] = Field(default_factory=list, description="Constructor arguments in words.")
    inputs: list[str] = Field(default_factory=list, description="forward's arguments in words.")
    outputs: str = ""
    weights: list[str] = Field(default_factory=list, description="Parameters and buffers: name, shape, dtype.")
    parent: ModuleCandidate | None = Field(None, description="The candidate to repair or improve.")
    parent_ref: str | None = None
    parent_report: dict[str, Any] | None = None
    instructions: str | None = None
    variant: int = Field(0, ge=0, description="A diversity hint (the number of siblings).")


def module_lineage(req: ModuleRequest) -> dict[str, Any]:
    """Provenance entries about the parent (empty without one)."""
    if req.parent is None:
        return {}
    out: dict[str, Any] = {"parent": req.parent_ref, "parent_sha256": req.parent.sha256,
                           "parent_provider": req.parent.provider}
    if req.parent_report and req.parent_report.get("verdict") is not None:
        out["parent_verdict"] = req.parent_report["verdict"]
    return out


def _source(obj: Any) -> str | None:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return None


def _class_fields(capture: Artifact, manifest: CaptureManifest) -> dict[str, Any]:
    """class_source, forward_source and signature of the captured class, as far as readable."""
    from modulelens.capture.replay import LoadedCapture

    try:
        cls = LoadedCapture(capture).resolver(manifest.class_path)
        forward = cls.forward
    except Exception:  # noqa: BLE001 - not importable here, or untrusted: the prompt says so
        return {}
    out: dict[str, Any] = {}
    try:
        sig = inspect.signature(forward)
        out["signature"] = str(sig.replace(parameters=list(sig.parameters.values())[1:]))
    except (TypeError, ValueError):
        pass
    text = _source(cls)
    if text is not None and len(text) <= MAX_CLASS_CHARS:
        out["class_source"] = text
    else:
        out["forward_source"] = _source(forward)
    return out


def _described(spec: Any) -> str:
    return describe_value(spec, None)[2]


def describe_capture(capture: Artifact) -> ModuleRequest:
    """The request for a fresh ModelNew for ``capture`` (see the module docstring)."""
    m = capture_manifest(capture)
    construction = []
    if m.init is not None:
        construction = [f"positional {i}: {_described(a)}" for i, a in enumerate(m.init.args)]
        construction += [f"{k}: {_described(v)}" for k, v in m.init.kwargs.items()]
    inputs = [f"positional {i}: {_described(a)}" for i, a in enumerate(sequence_items(m.inputs.args))]
    inputs += [f"keyword {k}: {_described(v)}" for k, v in mapping_items(m.inputs.kwargs)]
    weights = [f"{name}: shape {list(s.shape)}, {s.dtype}" for name, s in m.weight_specs().items()]
    if len(weights) > MAX_WEIGHT_LINES:
        weights = weights[:MAX_WEIGHT_LINES] + [f"(and {len(weights) - MAX_WEIGHT_LINES} more)"]
    return ModuleRequest(capture=capture.ref, class_path=m.class_path, module_path=m.module_path,
                         training=m.training, construction=construction, inputs=inputs,
                         outputs=_described(m.outputs) if m.outputs is not None else "None", weights=weights,
                         **_class_fields(capture, m))
