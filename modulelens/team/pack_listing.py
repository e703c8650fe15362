"""Stored packs as ``list_packs`` and ``show_pack`` show them: each version's entries (with shape
rules and phases) joined with the hits of its last ``run`` and its last ``check_pack``
(:mod:`modulelens.dispatch.results`)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from modulelens.dispatch.results import PackResultManifest, latest_results
from modulelens.repo import Artifact, Repository
from modulelens.repo.trust import is_trusted
from modulelens.team.packs import PACKS, STORED_PACK_FILE, PackEntrySummary, PackManifest


class PackUse(BaseModel):
    """The last run or check of a pack."""

    subject: str = Field(description="The script run, or the captures checked.")
    ok: bool | None = Field(None, description="check: ok; run: outputs matched (null without compare).")
    hits: int = 0
    fallbacks: int = 0
    summary: str = ""
    at: str = Field("", description="When it was recorded.")
    record: str = Field("", description="The stored result (pack_results NAME.vN:vK).")


class PackedEntryListing(PackEntrySummary):
    """A pack entry with the hits of the last run (per phase) and of the last check."""

    run_hits: dict[str, int] | None = Field(None, description="Last run: hits per phase (null: never run).")
    run_fallbacks: int | None = None
    check_hits: int | None = Field(None, description="Last check: hits (null: never checked).")


class PackListing(BaseModel):
    ref: str = Field(description="NAME:vN; pass it to run and check_pack.")
    sha256: str
    created_at: str
    trusted: bool = Field(description="Loadable here (written here, or trusted after a pull).")
    torch: str
    device: str
    entries: list[PackedEntryListing]
    last_run: PackUse | None = None
    last_check: PackUse | None = None


class PackView(PackListing):
    path: str = Field(description="The pack file inside the repository.")
    environment: dict = Field(default_factory=dict)
    candidates: list[str] = Field(default_factory=list)
    tags: list[str] = Field(default_factory=list)


def _use(m: PackResultManifest | None) -> PackUse | None:
    if m is None:
        return None
    return PackUse(subject=m.subject, ok=m.ok, hits=m.hits, fallbacks=m.fallbacks, summary=m.summary,
                   at=m.created_at, record=m.ref)


def pack_listing(repo: Repository, art: Artifact) -> PackListing:
    m = art.manifest_as(PackManifest)
    results = latest_results(repo, art)
    run, check = results.get("run"), results.get("check_pack")
    run_by = {e.candidate_id: e for e in run.entries} if run else {}
    check_hits: dict[str, int] = {}
    for e in check.entries if check else []:
        check_hits[e.candidate_id] = check_hits.get(e.candidate_id, 0) + e.hits
    entries = [PackedEntryListing(**e.model_dump(),
                                  run_hits=run_by[e.candidate_id].hits_by_phase if e.candidate_id in run_by else None,
                                  run_fallbacks=run_by[e.candidate_id].fallbacks if e.candidate_id in run_by else None,
                                  check_hits=check_hits.get(e.candidate_id, 0) if check else None)
               for e in m.entries]
    return PackListing(ref=art.ref, sha256=m.sha256, created_at=m.created_at, trusted=is_trusted(art.path),
                       torch=m.environment.torch, device=m.environment.device_name, entries=entries,
                       last_run=_use(run), last_check=_use(check))


def pack_listings(repo: Repository, name: str | None = None) -> list[PackListing]:
    """The newest version of every stored pack (every version of ``name``), newest first."""
    if name is not None:
        arts = [repo.open(PACKS, f"{name}:v{v}") for v in reversed(repo.versions(PACKS, name))]
    else:
        arts = [repo.open(PACKS, n) for n in repo.names(PACKS)]
    return sorted((pack_listing(repo, a) for a in arts), key=lambda p: p.created_at, reverse=True)


def pack_view(repo: Repository, ref: str) -> PackView:
    art = repo.open(PACKS, ref)
    m = art.manifest_as(PackManifest)
    tags = sorted(t for t, v in repo.aliases(PACKS, art.name).items() if v == art.version and t != "latest")
    return PackView(**pack_listing(repo, art).model_dump(), path=str(art.path / STORED_PACK_FILE),
                    environment=m.environment.model_dump(), candidates=m.candidates, tags=tags)
