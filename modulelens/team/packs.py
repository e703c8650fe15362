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
from modulelens.dispatch.results import PackUse, latest_results, pack_use
from modulelens.errors import InvalidName, ModuleLensError, tool_call
from modulelens.paths import input_path, resolve
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


def given_pack_file(ref: str, base: Path, field: str = "pack") -> Path | None:
    """The pack file a ``pack`` argument names when something exists at ``ref`` resolved against
    ``base`` (the project folder of the call, see :mod:`modulelens.paths`): it must be a regular
    file. None when nothing is there: ``ref`` is then a stored pack's reference."""
    if ref.strip() and "\x00" not in ref and not (Path(base) / Path(ref).expanduser()).exists():
        return None
    return input_path(ref, base, field)


def pack_file(repo: Repository, ref: str, base: Path) -> Path:
    """The pack file ``ref`` names: a pack file (relative paths from ``base``, the project folder),
    or a stored pack's reference (``NAME``, ``NAME:vN``, ``NAME@tag``)."""
    given = given_pack_file(ref, base)
    if given is not None:
        return given
    try:
        return usable_path(PACKS, repo.open(PACKS, ref).path)
    except (ModuleLensError, InvalidName):
        raise ModuleLensError(f"pack {ref!r} is neither a file ({resolve(ref, base)} does not exist) nor a stored pack",
                              f"give a pack file (an absolute path, or one relative to the project folder "
                              f"{Path(base).absolute()}) or a stored pack: {tool_call('list', kind='packs')}") from None


def stored_pack_for(repo: Repository, sha256: str) -> Artifact | None:
    """The newest stored pack version whose content has ``sha256``, if any."""
    for name in repo.names(PACKS):
        found = _same_pack(repo, name, sha256)
        if found is not None:
            return found
    return None
class PackListEntry(BaseModel):
    """One stored pack version, in a listing."""

    ref: str = Field(description="name:vN of the stored pack.")
    path: str = Field(description="Its pack file (what `run` and `check_pack` take as pack).")
    sha256: str
    trusted: bool = Field(description="Signed here: loadable. Else review and trust it first.")
    entries: int
    dispatched: int = Field(description="Entries that will be used (validated correct and faster than eager).")
    shape_rules: int = Field(0, description="Entries that admit other sizes by a checked shape rule.")
    backward: int = Field(0, description="Entries that serve the backward pass.")
    created_at: str
    last_run: PackUse | None = Field(None, description="Its last run (hits, whether outputs matched).")
    last_check: PackUse | None = Field(None, description="Its last check_pack (ok, hits).")


class PackedEntryView(PackEntrySummary):
    """A pack entry with the hits of the last run (per phase) and of the last check."""

    run_hits: dict[str, int] | None = Field(None, description="Last run: hits per phase (null: never run).")
    run_fallbacks: int | None = None
    check_hits: int | None = Field(None, description="Last check: hits (null: never checked).")


def entry_views(repo: Repository, art: Artifact) -> tuple[list[PackedEntryView], PackUse | None, PackUse | None]:
    """The stored pack ``art``'s entries with the hits of its last run and check, and those two."""
    results = latest_results(repo, art)
    run, check = results.get("run"), results.get("check_pack")
    run_by = {e.candidate_id: e for e in run.entries} if run else {}
    check_hits: dict[str, int] = {}
    for e in check.entries if check else []:
        check_hits[e.candidate_id] = check_hits.get(e.candidate_id, 0) + e.hits
    views = []
    for e in art.manifest_as(PackManifest).entries:
        ran = run_by.get(e.candidate_id)
        views.append(PackedEntryView(**e.model_dump(), run_hits=ran.hits_by_phase if ran else (None if run is None else {}),
                                     run_fallbacks=ran.fallbacks if ran else None,
                                     check_hits=check_hits.get(e.candidate_id, 0) if check else None))
    return views, pack_use(run), pack_use(check)


def pack_entries(repo: Repository, name: str | None = None) -> list[PackListEntry]:
    """Every stored pack version (made by ``pack``, pushed or pulled), by name then version; only the
    versions of ``name`` when given (an unknown name is a clear error); each with its last run and
    check (:mod:`modulelens.dispatch.results`)."""
    from modulelens.repo import is_trusted

    if name:
        repo.resolve(PACKS, name)
    out = []
    for n in [name] if name else repo.names(PACKS):
        for v in repo.versions(PACKS, n):
            art = repo.open(PACKS, f"{n}:v{v}")
            m = art.manifest_as(PackManifest)
            results = latest_results(repo, art)
            out.append(PackListEntry(ref=art.ref, path=str(art.file(STORED_PACK_FILE)), sha256=m.sha256,
                                     trusted=is_trusted(art.path), entries=len(m.entries),
                                     dispatched=sum(e.dispatched for e in m.entries),
                                     shape_rules=sum(e.shape_rule is not None for e in m.entries),
                                     backward=sum(e.phase == "backward" for e in m.entries), created_at=m.created_at,
                                     last_run=pack_use(results.get("run")),
                                     last_check=pack_use(results.get("check_pack"))))
    return out
