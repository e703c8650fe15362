"""The manifest of a ``captures`` artifact: what was captured and how to rebuild and replay it.

Every reader of a capture goes through :class:`CaptureManifest` (``artifact.manifest_as(
CaptureManifest)`` or :func:`capture_manifest`); nothing reads the stored JSON by string key.
Fields added after the first release have defaults, so captures written by earlier versions load.

Value specs (``inputs``, ``outputs``, ``weights``) stay JSON here: their format belongs to
:mod:`modulelens.capture.spec`, and the methods below read them through it (``input_leaves()``,
``weight_specs()``, ...). ``init`` is the module's recorded construction, a
:class:`~modulelens.capture.spec.ModuleSpec`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from modulelens.capture.spec import ModuleSpec, TensorSpec, ValueKind
from modulelens.capture.spec_walk import tensor_leaves
from modulelens.repo import Artifact, ManifestBase

KIND = "captures"
SCHEMA = 2
"""The schema captures are written with: 2 since export programs are stored without their weights
(``export.weights == "separate"``), which a reader of schema 1 would load as empty parameters."""


def _unset(value: Any) -> bool:
    """Fields added after the first release are left out of the stored form while empty, so a
    manifest written by an earlier version loads and dumps unchanged."""
    return value is None or value == [] or value == {} or value == ""

Strategy = Literal["source", "export", "pickle"]


class CallInputs(BaseModel):
    """Value specs of the positional and keyword arguments of the captured call."""

    args: Any = Field(default_factory=lambda: {"$": ValueKind.TUPLE.value, "items": []})
    kwargs: Any = Field(default_factory=lambda: {"$": ValueKind.DICT.value, "items": []})

    def tensor_leaves(self) -> list[TensorSpec]:
        """Every input tensor: positional ones first, then keyword ones, in stored order."""
        return tensor_leaves(self.args) + tensor_leaves(self.kwargs)


class ExportInfo(BaseModel):
    """The saved ``torch.export`` program. ``calling`` is ``call`` for programs of the module itself
    (captures of earlier versions: called with the captured args and kwargs) and ``leaves`` for a
    :class:`~modulelens.capture.leafcall.LeafCall` program: called with the input tensors in the
    order of ``input_keys``, returning the tensors of ``returned_keys``. ``custom_ops`` maps each
    operator of the program outside torch's namespaces to the modules to import before loading it.
    ``weights`` is ``separate`` when the program was saved without its parameters and buffers (they
    are on the meta device; the capture's weights fill them), ``embedded`` for earlier captures."""

    ok: bool = False
    error: str | None = None
    seconds: float = 0.0
    calling: Literal["call", "leaves"] = Field("call", exclude_if=lambda v: v == "call")
    input_keys: list[str] = Field(default_factory=list, exclude_if=_unset)
    returned_keys: list[str] = Field(default_factory=list, exclude_if=_unset)
    custom_ops: dict[str, list[str]] = Field(default_factory=dict, exclude_if=_unset)
    weights: Literal["embedded", "separate"] = Field("embedded", exclude_if=lambda v: v == "embedded")


class ActivationStorage(BaseModel):
    """How the call's activations (inputs and outputs) were stored against the capture's byte
    budget (what the stored weights left of it): ``full``; ``batch_slice`` (the first ``rows`` of
    ``batch_rows`` rows along dimension ``batch_dim``, the module having matched the real output on
    them within tolerance: ``check_max_abs_error``); or ``shape_only`` (statistics only).
    ``reason`` says why, in words."""

    mode: Literal["full", "batch_slice", "shape_only"]
    budget_bytes: int
    total_bytes: int = Field(description="inputs and outputs of the real call")
    rows: int | None = None
    batch_rows: int | None = None
    batch_dim: int = Field(0, exclude_if=lambda v: v == 0)
    check_max_abs_error: float | None = None
    reason: str = ""


class WeightStorage(BaseModel):
    """How the module's parameters and buffers were stored against the capture's byte budget:
    ``full``, or ``shape_only`` (statistics only: replay makes values up and cannot compare)."""

    mode: Literal["full", "shape_only"]
    total_bytes: int
    budget_bytes: int
    reason: str = ""


class UnrecordedField(BaseModel):
    """A value the capture could not store as data, and what that costs: ``blocks`` lists the replay
    strategies it rules out (``source``, ``export``) or ``comparison`` (an output value not compared);
    ``read_by_call`` says whether the captured call read it (constructor arguments whose reads could
    be watched; None otherwise); ``effect`` says it in words."""

    path: str = Field(description="where it was: init.config.field, args.1.x, output.meta")
    type: str = Field(description="module:QualName of its type")
    repr: str = ""
    why: str = ""
    blocks: list[str] = Field(default_factory=list)
    read_by_call: bool | None = None
    effect: str = ""

    def text(self) -> str:
        """One line: the path, why it was not recorded, and what it blocks."""
        cost = f"blocks {' and '.join(self.blocks)}" if self.blocks else "blocks nothing"
        return f"{self.path} ({self.type}: {self.repr[:60]}): {self.why}; {cost} ({self.effect})"


class BackwardInfo(BaseModel):
    """Which gradients were captured (their tensors are in ``grads.safetensors``)."""

    grad_output: list[bool] = Field(default_factory=list)
    grad_input: list[bool] = Field(default_factory=list)
    param_grads: list[str] = Field(default_factory=list)


class RunSource(BaseModel):
    """How the capture was produced: a script, a KernelBench file, or the Python API."""

    kind: str = "script"
    script: str | None = None
    argv: list[str] = Field(default_factory=list)
    cwd: str | None = None


class StoredSource(BaseModel):
    """A copy of a file whose classes cannot be imported by name later (a script's ``__main__``)."""

    file: str = Field(description="path inside the artifact")
    original: str = Field("", description="where the file was at capture time")


class DistributedInfo(BaseModel):
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0


class CaptureEnvironment(BaseModel):
    torch: str = ""
    python: str = ""
    platform: str = ""
    host: str = ""
    device: str = "cpu"
    num_threads: int = 0
    processor: str = Field("", exclude_if=_unset, description="the processor model the call ran on (CPU model name, GPU name)")
    numerics: dict[str, bool | str] = Field(
        default_factory=dict, exclude_if=_unset,
        description="PyTorch's numeric settings at the call (oneDNN, TF32, matmul precision, deterministic "
        "algorithms): a replay runs under them",
    )


class CaptureManifest(ManifestBase):
    module_path: str = ""
    class_path: str = ""
    target: str = ""
    call_index: int = 1
    strategies: list[Strategy] = Field(default_factory=list)
    init: ModuleSpec | None = Field(None, description="the recorded construction (None: not recorded)")
    attributes: dict[str, dict[str, Any]] = Field(
        default_factory=dict, exclude_if=_unset,
        description="plain attributes (None, bool, int, float, str) of the module and its submodules at the "
        "captured call, by submodule name: restored on a rebuilt module",
    )
    inputs: CallInputs = Field(default_factory=CallInputs)
    outputs: Any = None
    activations: ActivationStorage | None = Field(None, exclude_if=_unset)
    weights_storage: WeightStorage | None = Field(None, exclude_if=_unset)
    state_after: dict[str, Any] = Field(
        default_factory=dict, exclude_if=_unset,
        description="tensor specs of the state the forward changed, as it was after it: input tensors "
        "(keyed like the inputs) and buffers (module.<name>); their data is in state.safetensors",
    )
    weights: dict[str, Any] = Field(default_factory=dict)
    training: bool = False
    grad_enabled: bool = False
    autocast: dict[str, str] = Field(default_factory=dict, exclude_if=_unset,
                                     description="torch.autocast regions active at the call: device type -> dtype")
    forward_seconds: float = 0.0
    export: ExportInfo = Field(default_factory=ExportInfo)
    backward: BackwardInfo | None = None
    shape_only: list[str] = Field(default_factory=list)
    unrecorded: list[str] = Field(default_factory=list, description="one line per value not recorded (the text of "
                                  "unrecorded_values; captures of earlier versions: path and why only)")
    unrecorded_values: list[UnrecordedField] = Field(default_factory=list, exclude_if=_unset)
    notes: list[str] = Field(default_factory=list)
    source: RunSource = Field(default_factory=RunSource)
    sources: dict[str, StoredSource] = Field(default_factory=dict)
    sys_path: list[str] = Field(default_factory=list)
    distributed: DistributedInfo | None = None
    environment: CaptureEnvironment = Field(default_factory=CaptureEnvironment)
    input_tensors: int = 0

    def output_leaves(self) -> list[TensorSpec]:
        """Every output tensor, in stored order."""
        return tensor_leaves(self.outputs)

    def state_specs(self) -> dict[str, TensorSpec]:
        """The state the forward changed, by key."""
        return {key: TensorSpec.from_json(spec) for key, spec in self.state_after.items()}

    def weight_specs(self) -> dict[str, TensorSpec]:
        """Parameters and buffers by qualified name."""
        return {name: TensorSpec.from_json(spec) for name, spec in self.weights.items()}


def capture_manifest(artifact: Artifact) -> CaptureManifest:
    """The typed manifest of a ``captures`` artifact."""
    return artifact.manifest_as(CaptureManifest)
