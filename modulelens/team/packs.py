"""Kernel packs in the repository: a pack file as a repository version of kind ``packs``.

``pack`` stores every pack it makes as a version ``packs/NAME/vN`` (and writes the file to
``--out`` when asked); ``push FILE --kind packs`` stores a pack file the same way first (NAME: the
file's name without its last suffix). A version with the same pack sha256 is reused. Its manifest
(:class:`PackManifest`) carries the pack's sha256, environment, an entries summary (shape rules
and phases included) and the candidates it was made from (the lineage), and it is pushed like any
other version. A pulled pack arrives as such a version, unsigned; its file ``pack.json`` is what
``run --pack``, ``check-pack`` and ``use_pack`` take once the version is trusted
(:func:`modulelens.dispatch.pack.read_pack` checks it); the tools also take the stored pack's
reference (``NAME``, ``NAME:vN``, ``NAME@tag``) instead of a path (:func:`pack_file`).
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
    phase: str = "forward"
    shape_rule: str | None = Field(None, description="The checked shape rule (None: exact shapes).")


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


def store_pack(repo: Repository, path: Path, name: str | None = None) -> Artifact:
    """The repository version holding the pack file ``path`` (verified, not loaded), stored now as
    ``name`` (default: :func:`pack_name`) unless a version with its sha256 is already there. It is
    signed only when the file is trusted here, so storing never makes a copied pack loadable."""
    p, sha256, content = verify_pack_file(path)
    name = validate_name(name) if name else pack_name(p)
    present = _same_pack(repo, name, sha256)
    if present is not None:
        return present

    def write(folder: Path) -> PackManifest:
        shutil.copyfile(p, folder / STORED_PACK_FILE)
        entries = [PackEntrySummary(candidate_id=e.candidate_id, kind=e.kind, target=e.op or e.target,
                                    backend=e.backend, verdict=e.report.verdict, speedup_vs_eager=e.speedup_vs_eager,
                                    dispatched=e.skip_reason() is None, phase=e.phase,
                                    shape_rule=e.shape_rule.summary() if e.shape_rule else None)
                   for e in content.entries]
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


def pack_file(repo: Repository, ref: str) -> Path:
    """The pack file ``ref`` names: a path to a pack file, or a stored pack's reference
    (``NAME``, ``NAME:vN``, ``NAME@tag``)."""
    path = Path(ref).expanduser()
    if path.is_file():
        return path.resolve()
    try:
        return usable_path(PACKS, repo.open(PACKS, ref).path)
    except (ModuleLensError, InvalidName):
        raise ModuleLensError(f"no pack file and no stored pack named {ref!r}",
                              "give a file written by `modulelens pack --out`, or a stored pack (list_packs)") from None


def stored_pack_for(repo: Repository, sha256: str) -> Artifact | None:
    """The newest stored pack version whose content has ``sha256``, if any."""
    for name in repo.names(PACKS):
        found = _same_pack(repo, name, sha256)
        if found is not None:
            return found
    return None
