"""What happened when a stored pack was used: the results of ``run`` and ``check_pack``, kept next
to the pack so that listing it shows its hits and checks.

Each run or check of a pack stored as ``packs/NAME/vN`` (found by its content's sha256, so a
``--out`` file of that pack counts too) adds a version of ``pack_results/NAME.vN`` whose manifest
is a :class:`PackResultManifest`: which tool, whether it was ok, hits and fallbacks per entry and
phase, and its one-line summary. The pack's own version is never changed (it is signed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, Field

from modulelens.repo import Artifact, ManifestBase, Repository

if TYPE_CHECKING:  # listing a pack's results needs no torch
    from modulelens.dispatch.runtime import EntryReport

PACK_RESULTS = "pack_results"
MAX_REASONS = 5  # fallback reasons kept per entry


class EntryOutcome(BaseModel):
    candidate_id: str
    hits: int = 0
    hits_by_phase: dict[str, int] = Field(default_factory=dict)
    fallbacks: int = 0
    fallback_reasons: dict[str, int] = Field(default_factory=dict, description="The most frequent ones.")


class PackResultManifest(ManifestBase):
    """One use of a stored pack: a ``run`` of a script or a ``check_pack`` of its captures."""

    pack: str = Field(description="The stored pack (NAME:vN).")
    sha256: str
    tool: Literal["run", "check_pack"]
    subject: str = Field(description="The script run, or the captures checked.")
    ok: bool | None = Field(None, description="check_pack: ok; run: outputs matched (None without --compare).")
    hits: int = 0
    fallbacks: int = 0
    summary: str = ""
    entries: list[EntryOutcome] = Field(default_factory=list)


class PackUse(BaseModel):
    """The last run or check of a stored pack, as listings show it."""

    subject: str = Field(description="The script run, or the captures checked.")
    ok: bool | None = Field(None, description="check: ok; run: outputs matched (null without compare).")
    hits: int = 0
    fallbacks: int = 0
    summary: str = ""
    at: str = Field("", description="When it was recorded.")
    record: str = Field("", description="The stored result (pack_results NAME.vN:vK).")


def pack_use(m: PackResultManifest | None) -> PackUse | None:
    if m is None:
        return None
    return PackUse(subject=m.subject, ok=m.ok, hits=m.hits, fallbacks=m.fallbacks, summary=m.summary,
                   at=m.created_at, record=m.ref)


def results_name(pack: Artifact) -> str:
    return f"{pack.name}.v{pack.version}"


def outcomes(entries: list[EntryReport]) -> list[EntryOutcome]:
    """Each entry's hits and fallbacks (the most frequent reasons only)."""
    return [EntryOutcome(candidate_id=e.candidate_id, hits=e.hits, hits_by_phase=e.hits_by_phase,
                         fallbacks=e.fallbacks,
                         fallback_reasons=dict(list(e.fallback_reasons.items())[:MAX_REASONS])) for e in entries]


def record_result(repo: Repository, pack: Artifact, sha256: str, result: PackResultManifest) -> Artifact:
    """Store ``result`` as the newest result of the stored pack ``pack``."""
    fields = result.model_copy(update={"pack": pack.ref, "sha256": sha256})
    return repo.create(PACK_RESULTS, results_name(pack), lambda folder: fields)


def latest_results(repo: Repository, pack: Artifact) -> dict[str, PackResultManifest]:
    """The newest result of each tool (``run``, ``check_pack``) recorded for ``pack``."""
    name = results_name(pack)
    out: dict[str, PackResultManifest] = {}
    for version in reversed(repo.versions(PACK_RESULTS, name)):
        m = repo.open(PACK_RESULTS, f"{name}:v{version}").manifest_as(PackResultManifest)
        out.setdefault(m.tool, m)
        if len(out) == 2:
            break
    return out
