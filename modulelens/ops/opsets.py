"""The opsets in a repository, one row per stored version (read through :class:`OpSetManifest`)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from modulelens.capture import KIND as CAPTURES
from modulelens.ops.model import KIND, OpSetManifest
from modulelens.repo import Repository


class OpsetEntry(BaseModel):
    ref: str = Field(description="name:vN of the opset (cards are <ref>/<index>).")
    name: str
    version: int
    tags: list[str] = Field(default_factory=list)
    capture: str = Field(description="The capture the cards were recorded from (name:vN).")
    cards: int = Field(description="Number of cards.")
    module_time_s: float = Field(description="Median plain run time of the module.")
    device: str
    backward: bool
    created_at: str


def _tags_at(repo: Repository, kind: str, name: str, version: int) -> list[str]:
    """The aliases of ``name`` that point at ``version`` (``latest`` included), sorted."""
    return sorted(tag for tag, v in repo.aliases(kind, name).items() if v == version)


def opset_entries(repo: Repository, capture: str | None = None) -> list[OpsetEntry]:
    """Every opset version, by name then version; only those recorded from ``capture`` when given
    (a capture reference, resolved first: an unknown capture is a clear error). capture_ops stores
    the opsets of a capture under the capture's name, so only that name is read then."""
    wanted = None
    names = repo.names(KIND)
    if capture:
        cap_name, cap_version = repo.resolve(CAPTURES, capture)
        wanted = f"{cap_name}:v{cap_version}"
        names = [n for n in names if n == cap_name]
    out = []
    for name in names:
        for version in repo.versions(KIND, name):
            m = repo.open(KIND, f"{name}:v{version}").manifest_as(OpSetManifest)
            if wanted is not None and m.capture != wanted:
                continue
            out.append(OpsetEntry(
                ref=f"{name}:v{version}", name=name, version=version, tags=_tags_at(repo, KIND, name, version),
                capture=m.capture, cards=len(m.cards), module_time_s=m.module_time.median_s, device=m.device,
                backward=m.backward, created_at=m.created_at,
            ))
    return out
