"""What every provider is asked for, and the provenance it records about a parent."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from modulelens.kernels import KernelSource
from modulelens.ops import OpCard


class GenerationRequest(BaseModel):
    """One candidate asked of a provider. Built once by the caller (a card read from its opset, or a
    card's stored JSON form, which validates into an :class:`OpCard`); providers read its fields."""

    card: OpCard = Field(description="The operator card to write a kernel for.")
    backend: Literal["cpp", "cuda", "triton"]
    parent: KernelSource | None = Field(None, description="The candidate to mutate or repair.")
    parent_report: dict[str, Any] | None = Field(
        None, description="The parent's validation report (verdict, correct, reason, errors, speedup_vs_eager, timing).")
    instructions: str | None = Field(None, description="Extra guidance from the user or agent.")
    variant: int = Field(0, ge=0, description="Which variant to produce (template index; a diversity hint for LLMs).")


def lineage(req: GenerationRequest) -> dict[str, Any]:
    """Provenance entries about the parent (empty without one)."""
    if req.parent is None:
        return {}
    out: dict[str, Any] = {"parent": req.parent.sha256, "parent_provider": req.parent.provider}
    if req.parent_report is not None and req.parent_report.get("verdict") is not None:
        out["parent_verdict"] = req.parent_report.get("verdict")
    return out
