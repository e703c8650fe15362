"""Kernel packs in the team repository: a pack file becomes a repository version of kind ``packs``.

A pack is one JSON file anywhere (``modulelens pack ... --out FILE``); the team repository moves
repository versions. So ``push FILE --kind packs`` first stores the file as a version
``packs/NAME/vN`` (NAME: the file's name without its last suffix; a version with the same pack
sha256 is reused), whose manifest (:class:`PackManifest`) carries the pack's sha256, environment,
an entries summary and the candidates it was made from (the lineage), and pushes that version like
any other. A pulled pack arrives as such a version, unsigned; its file ``pack.json`` is what
``run --pack``, ``check-pack`` and ``use_pack`` take once the version is trusted
(:func:`modulelens.dispatch.pack.read_pack` checks it).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from pydantic import BaseModel, Field

from modulelens.dispatch.pack import STORED_PACK_FILE, PackEnvironment, pack_is_trusted, verify_pack_file
from modulelens.errors import InvalidName, ModuleLensError
from modulelens.repo import Artifact, ManifestBase, Repository, validate_name

PACKS = "packs"


class PackEntrySummary(BaseModel):
    """One entry of a pack, as its remote metadata shows it."""

    candidate_id: str
    kind: str
    target: str
    backend: str
    verdict: str
    speedup_vs_eager: float | None = None
    dispatched: bool


class PackManifest(ManifestBase):
    """A stored pack: the file ``pack.json`` and what it holds."""

    sha256: str = Field(description="sha256 of the pack's content (as `pack` printed it).")
    environment: PackEnvironment
    entries: list[PackEntrySummary]
    candidates: list[str] = Field(description="The candidate ids packed (its inputs).")


def pack_name(path: Path) -> str:
    """The repository name a pack file is stored under: its file name without its last suffix."""
    name = path.stem or path.name
    try:
        return validate_name(name)
    except InvalidName:
        raise ModuleLensError(f"cannot name a stored pack after {path.name!r}",
                              "rename the pack file (letters, digits, '.', '_', '-')") from None


def _same_pack(repo: Repository, name: str, sha256: str) -> Artifact | None:
    for version in reversed(repo.versions(PACKS, name)):
        art = repo.open(PACKS, f"{name}:v{version}")
        if art.manifest_as(PackManifest).sha256 == sha256:
            return art
    return None


def store_pack(repo: Repository, path: Path) -> Artifact:
    """The repository version holding the pack file ``path`` (verified, not loaded), stored now
    unless a version with its sha256 is already there. It is signed only when the file is trusted
    here, so storing never makes a copied pack loadable."""
    p, sha256, content = verify_pack_file(path)
    name = pack_name(p)
    present = _same_pack(repo, name, sha256)
    if present is not None:
        return present

    def write(folder: Path) -> PackManifest:
        shutil.copyfile(p, folder / STORED_PACK_FILE)
        entries = [PackEntrySummary(candidate_id=e.candidate_id, kind=e.kind, target=e.op or e.target,
                                    backend=e.backend, verdict=e.report.verdict, speedup_vs_eager=e.speedup_vs_eager,
                                    dispatched=e.skip_reason() is None) for e in content.entries]
        return PackManifest(sha256=sha256, environment=content.environment, entries=entries,
                            candidates=[e.candidate_id for e in content.entries])

    return repo.create(PACKS, name, write, signed=pack_is_trusted(p, sha256))


def open_pack(repo: Repository, ref: str) -> Artifact:
    """What ``push REF --kind packs`` sends: a pack file (stored first, see :func:`store_pack`), or a
    stored pack's ``NAME[:vN|@tag]`` when ``ref`` is not a file."""
    path = Path(ref).expanduser()
    return store_pack(repo, path) if path.is_file() else repo.open(PACKS, ref)


def usable_path(kind: str, folder: Path) -> Path:
    """What a stored version is used by: a pack's file (``run --pack PATH``), else its folder."""
    return folder / STORED_PACK_FILE if kind == PACKS else folder


class PackListEntry(BaseModel):
    """One stored pack version, in a listing."""

    ref: str = Field(description="name:vN of the stored pack.")
    path: str = Field(description="Its pack file (what `run` and `check_pack` take as pack).")
    sha256: str
    trusted: bool = Field(description="Signed here: loadable. Else review and trust it first.")
    entries: int
    dispatched: int = Field(description="Entries that will be used (validated correct and faster than eager).")
    created_at: str


def pack_entries(repo: Repository, name: str | None = None) -> list[PackListEntry]:
    """Every stored pack version (pushed, pulled or stored by ``push``), by name then version; only
    the versions of ``name`` when given (an unknown name is a clear error). Pack files written by
    ``pack`` elsewhere are not in the repository until pushed."""
    from modulelens.repo.trust import is_trusted

    if name:
        repo.resolve(PACKS, name)
    out = []
    for n in [name] if name else repo.names(PACKS):
        for v in repo.versions(PACKS, n):
            art = repo.open(PACKS, f"{n}:v{v}")
            m = art.manifest_as(PackManifest)
            out.append(PackListEntry(ref=art.ref, path=str(art.file(STORED_PACK_FILE)), sha256=m.sha256,
                                     trusted=is_trusted(art.path), entries=len(m.entries),
                                     dispatched=sum(e.dispatched for e in m.entries), created_at=m.created_at))
    return out
