"""What a capture holds, in a few lines: the record ``show`` (kind capture) and ``capture_module`` return,
built from the typed manifest (the CLI's view of it is in :mod:`modulelens.cli.views`)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from modulelens.capture.manifest import KIND, ActivationStorage, capture_manifest
from modulelens.capture.spec import TensorSpec
from modulelens.repo import Artifact, Repository


class TensorInfo(BaseModel):
    key: str
    shape: list[int]
    dtype: str
    stored: bool = Field(description="False when stored shape-only (statistics kept, data not).")

    @classmethod
    def of(cls, spec: TensorSpec) -> TensorInfo:
        return cls(key=spec.key, shape=spec.shape, dtype=spec.dtype, stored=spec.stored)


class CaptureSummary(BaseModel):
    ref: str = Field(description="name:vN of this capture.")
    name: str
    version: int
    aliases: list[str] = Field(default_factory=list)
    module_path: str = Field(description="Qualified name of the module in the model ('' is the root).")
    class_path: str = Field(description="module:QualName of the module's class.")
    strategies: list[str] = Field(description="Replay strategies this capture supports, in auto order.")
    call_index: int
    training: bool
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    weights: int = Field(description="Number of parameter and buffer tensors.")
    shape_only: list[str] = Field(default_factory=list)
    backward: bool = Field(False, description="Whether gradients were captured.")
    unrecorded: list[str] = Field(default_factory=list, description="Values not recorded: type, why, what it blocks.")
    notes: list[str] = Field(default_factory=list)
    activations: ActivationStorage | None = Field(
        None, description="How inputs and outputs were stored against the byte budget (full, batch_slice, "
        "shape_only) and why.")
    rank: int | None = None
    world_size: int | None = None
    created_at: str = ""
    path: str = Field("", description="Folder of this version in the repository.")


def summarize(art: Artifact, aliases: list[str] | None = None) -> CaptureSummary:
    """The summary of a ``captures`` artifact; ``aliases`` are the tags pointing at it."""
    m = capture_manifest(art)
    return CaptureSummary(
        ref=art.ref, name=art.name, version=art.version, aliases=aliases or [],
        module_path=m.module_path, class_path=m.class_path, strategies=list(m.strategies),
        call_index=m.call_index, training=m.training,
        inputs=[TensorInfo.of(t) for t in m.inputs.tensor_leaves()],
        outputs=[TensorInfo.of(t) for t in m.output_leaves()], weights=len(m.weights),
        shape_only=list(m.shape_only), backward=m.backward is not None,
        unrecorded=list(m.unrecorded), notes=list(m.notes), activations=m.activations,
        rank=m.distributed.rank if m.distributed else None,
        world_size=m.distributed.world_size if m.distributed else None,
        created_at=m.created_at, path=str(art.path),
    )


def capture_warnings(s: CaptureSummary) -> list[str]:
    """What could mislead about a capture: shape-only data, batch slices, values not recorded."""
    out = []
    if s.activations is not None and s.activations.mode == "shape_only":
        out.append(f"inputs and outputs are stored shape-only ({s.activations.reason}): replays synthesise inputs "
                   "and cannot compare outputs")
    elif s.shape_only:
        out.append(f"{len(s.shape_only)} tensor(s) stored shape-only (larger than the per-tensor limit): replays "
                   "synthesise them")
    if s.activations is not None and s.activations.mode == "batch_slice":
        out.append(f"only the first {s.activations.rows} of {s.activations.batch_rows} batch rows are stored: "
                   "replays and validations are exact on that slice")
    if s.unrecorded:
        out.append(f"{len(s.unrecorded)} value(s) could not be recorded: {'; '.join(s.unrecorded[:2])}")
    return out


class CaptureEntry(BaseModel):
    """One stored capture version, in a listing."""

    ref: str
    name: str
    version: int
    tags: list[str]
    module_path: str
    class_path: str
    strategies: list[str]
    shape_only: bool = Field(False, description="Some inputs or outputs are stored as shapes only (replay synthesises "
                             "them, outputs not comparable).")
    created_at: str


def capture_entries(repo: Repository, name: str | None = None) -> list[CaptureEntry]:
    """Every capture version, by name then version; only the versions of ``name`` when given (an
    unknown name is a clear error)."""
    if name:
        repo.resolve(KIND, name)
    out = []
    for n in [name] if name else repo.names(KIND):
        aliases = repo.aliases(KIND, n)
        for v in repo.versions(KIND, n):
            m = capture_manifest(repo.open(KIND, f"{n}:v{v}"))
            out.append(CaptureEntry(
                ref=f"{n}:v{v}", name=n, version=v, tags=sorted(k for k, x in aliases.items() if x == v),
                module_path=m.module_path, class_path=m.class_path, strategies=list(m.strategies),
                shape_only=bool(m.shape_only) or bool(m.activations and m.activations.mode == "shape_only"),
                created_at=m.created_at,
            ))
    return out
