"""Candidates in the repository.

A candidate for card ``blk:v1/6`` is stored as ``candidates/blk.card6/vN`` (candidate id
``blk.card6:vN``) with its source file; its manifest is :class:`CandidateManifest` (nothing reads
it by string key). Its validation reports are stored by :mod:`modulelens.validation.stored_reports`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from modulelens.kernels.source import BackendName, KernelSource
from modulelens.ops import OpCard, parse_card_id
from modulelens.repo import Artifact, ManifestBase, Repository, parse_ref

CANDIDATES = "candidates"
_SUFFIX = {"cpp": "cpp", "cuda": "cu", "triton": "py"}


class CandidateTarget(BaseModel):
    """The card a candidate implements, as it was when the candidate was made."""

    card_id: str
    op: str
    shapes: list[list[int]] = Field(default_factory=list)
    dtypes: list[str] = Field(default_factory=list)
    kind: str = ""


class CandidateManifest(ManifestBase):
    """The manifest of a ``candidates`` artifact; the source text is in ``source_file``."""

    target: CandidateTarget
    backend: BackendName
    entry: str = "forward"
    family: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    provider: str = "agent"
    provenance: dict[str, Any] = Field(default_factory=dict)
    parent: str | None = Field(None, description="The candidate this one repairs or improves.")
    source_file: str
    source_sha256: str = ""


def candidate_name(card_id: str) -> str:
    """``blk.card6`` for card ``blk:v1/6``: one candidate name per card of a capture name."""
    opset_ref, index = parse_card_id(card_id)
    return f"{parse_ref(opset_ref).name}.card{index}"


def candidate_manifest(art: Artifact) -> CandidateManifest:
    """The typed manifest of a ``candidates`` artifact."""
    return art.manifest_as(CandidateManifest)


def save_candidate(repo: Repository, card: OpCard, src: KernelSource, parent: str | None = None) -> Artifact:
    """Store ``src`` as a new candidate for ``card`` (a card read from a stored opset)."""
    filename = f"kernel.{_SUFFIX[src.backend]}"

    def write(folder: Path) -> CandidateManifest:
        (folder / filename).write_text(src.source)
        return CandidateManifest(
            target=CandidateTarget(card_id=card.card_id, op=card.op, shapes=card.shapes, dtypes=card.dtypes,
                                   kind=card.kind),
            backend=src.backend, entry=src.entry, family=src.family, params=src.params, provider=src.provider,
            provenance=src.provenance, parent=parent, source_file=filename, source_sha256=src.sha256,
        )

    return repo.create(CANDIDATES, candidate_name(card.card_id), write)


def load_candidate(repo: Repository, candidate_id: str) -> tuple[Artifact, KernelSource]:
    """The candidate artifact ``candidate_id`` resolves to and its source."""
    art = repo.open(CANDIDATES, candidate_id)
    m = candidate_manifest(art)
    src = KernelSource(backend=m.backend, source=art.file(m.source_file).read_text(), entry=m.entry,
                       family=m.family, params=m.params, provider=m.provider, provenance=m.provenance)
    return art, src


def save_agent_candidate(repo: Repository, card_id: str, src: KernelSource) -> Artifact:
    """Store source the agent (or user) wrote for ``card_id`` as a new candidate; a clear error
    when the card does not exist."""
    from modulelens.ops import open_card

    _, card = open_card(repo, card_id)
    return save_candidate(repo, card, src)
