"""Import a folder of files fetched from a team repository as a local version, after verifying it.

The folder holds one pushed version: ``manifest.json`` and the files it lists. :func:`import_folder`

1. reads the manifest (:class:`~modulelens.repo.store.ManifestBase`) and checks its kind,
2. checks every file against the remote's digests (base64 md5, as W&B computes them), when given,
3. checks every file the manifest lists against its sha256 (and that its path stays in the folder),
4. stores the listed files (nothing else) as a new version of the same name, **unsigned**: the
   version is untrusted until ``modulelens trust REF --yes`` (see :mod:`modulelens.repo.trust`).
   The manifest gains ``pulled_from`` (the remote address and the version's reference on the
   machine that pushed it). References inside the manifest (a card id, a capture ref) keep the
   pushing machine's version numbers.

When a version with the same content is already stored, nothing is added and that version is
returned. :func:`restore_tags` then sets the remote's aliases that were local tags where they were
pushed as local tags again. Pure: no network, so it is tested on a local copy of the files.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from modulelens.errors import ChecksumMismatch, ModuleLensError
from modulelens.repo import (
    MANIFEST,
    ManifestBase,
    Repository,
    is_confined,
    is_trusted,
    sha256_file,
    validate_name,
    validation_problem,
)
from modulelens.team.model import PulledArtifact, is_local_tag
from modulelens.team.packs import PACKS, usable_path

PULLED_FROM = "pulled_from"
_BOOKKEEPING = set(ManifestBase.model_fields) | {PULLED_FROM}
_DAMAGED_HINT = "pull it again; if it fails again, the pushed artifact is damaged: push it again from its origin"


def md5_base64(path: Path) -> str:
    """The digest W&B records for a file: base64 of its md5."""
    h = hashlib.md5()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return base64.b64encode(h.digest()).decode()


def read_folder_manifest(folder: Path, origin: str) -> tuple[dict[str, Any], ManifestBase]:
    """The raw and validated manifest of a fetched folder; one-line errors when missing or malformed."""
    try:
        raw = json.loads((folder / MANIFEST).read_text())
        return raw, ManifestBase.model_validate(raw)
    except OSError:
        raise ChecksumMismatch(f"{origin} has no {MANIFEST}", "it was not pushed by `modulelens push`") from None
    except json.JSONDecodeError as e:
        raise ChecksumMismatch(f"{MANIFEST} of {origin} is not JSON ({e})", _DAMAGED_HINT) from None
    except ValidationError as e:
        raise ChecksumMismatch(f"{MANIFEST} of {origin} does not have the expected form "
                               f"({validation_problem(e, 'manifest')})",
                               _DAMAGED_HINT) from None


def verify_digests(folder: Path, digests: dict[str, str], origin: str) -> None:
    """Each file against the remote's base64 md5 (the download arrived as the remote stored it)."""
    for rel, expected in sorted(digests.items()):
        path = folder / rel
        if not is_confined(folder, rel) or not path.is_file():
            raise ChecksumMismatch(f"file {rel!r} of {origin} is missing after the download", _DAMAGED_HINT)
        actual = md5_base64(path)
        if actual != expected:
            raise ChecksumMismatch(f"file {rel!r} of {origin} does not match the remote's md5 "
                                   f"(expected {expected}, found {actual})", _DAMAGED_HINT)


def verify_checksums(folder: Path, manifest: ManifestBase, origin: str) -> None:
    """Each file the manifest lists against its sha256 (the files are the ones that were pushed)."""
    for rel, expected in sorted(manifest.files.items()):
        path = folder / rel
        if not is_confined(folder, rel):
            raise ChecksumMismatch(f"file {rel!r} of {origin} lies outside the artifact",
                                   "the manifest was crafted or damaged; do not use this artifact")
        if not path.is_file():
            raise ChecksumMismatch(f"file {rel!r} listed in the manifest of {origin} was not downloaded", _DAMAGED_HINT)
        actual = sha256_file(path)
        if actual != expected:
            raise ChecksumMismatch(f"file {rel!r} of {origin} does not match the sha256 in its manifest "
                                   f"(expected {expected[:12]}..., found {actual[:12]}...)", _DAMAGED_HINT)


def _content(raw: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in raw.items() if k not in _BOOKKEEPING}


def _same_version(repo: Repository, kind: str, manifest: ManifestBase, raw: dict[str, Any]) -> str | None:
    """The reference of a stored version with these files and this manifest content, if any."""
    for version in reversed(repo.versions(kind, manifest.name)):
        art = repo.open(kind, f"{manifest.name}:v{version}")
        if art.base.files == manifest.files and _content(art.raw_manifest) == _content(raw):
            return art.ref
    return None


def import_folder(repo: Repository, folder: Path, *, kind: str, origin: str,
                  digests: dict[str, str] | None = None) -> PulledArtifact:
    """Verify the fetched ``folder`` and store it as an untrusted version of ``kind`` (see the
    module docstring). ``origin`` is the remote address it came from; ``digests`` the remote's
    base64 md5 by path (None skips that check, for a copy that did not come through a remote)."""
    raw, manifest = read_folder_manifest(folder, origin)
    if manifest.kind != kind:
        raise ModuleLensError(f"{origin} is stored on the remote as {kind} but its manifest says {manifest.kind!r}",
                              "the artifact was not pushed by `modulelens push`; do not use it")
    validate_name(manifest.name)
    if digests is not None:
        verify_digests(folder, digests, origin)
    verify_checksums(folder, manifest, origin)
    present = _same_version(repo, kind, manifest, raw)
    if present is not None:
        art = repo.open(kind, present)
        return _pulled(art.ref, art.path, kind, origin, manifest, already_present=True)

    def write(dest: Path) -> dict[str, Any]:
        for rel in manifest.files:
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(folder / rel, dest / rel)
        return {**_content(raw), PULLED_FROM: {"address": origin, "ref": manifest.ref, "created_at": manifest.created_at}}

    art = repo.create(kind, manifest.name, write, signed=False, schema_version=manifest.schema_version or 1)
    return _pulled(art.ref, art.path, kind, origin, manifest, already_present=False)


def _pulled(ref: str, path: Path, kind: str, origin: str, manifest: ManifestBase, *, already_present: bool) -> PulledArtifact:
    trusted = is_trusted(path)
    usable = usable_path(kind, path)
    use = f"using it with `--pack {usable}`" if kind == PACKS else "replaying or validating it"
    step = "" if trusted else (f"review it with `modulelens trust {ref} --kind {kind}`, then trust it with "
                               f"`modulelens trust {ref} --kind {kind} --yes` before {use}")
    return PulledArtifact(ref=ref, kind=kind, origin=origin, origin_ref=manifest.ref, path=str(usable),
                          files=len(manifest.files), trusted=trusted, already_present=already_present, next_step=step)


def restore_tags(repo: Repository, pulled: PulledArtifact, aliases: list[str]) -> PulledArtifact:
    """Set each of the remote ``aliases`` that was a local tag (:func:`~modulelens.team.model.is_local_tag`)
    as a local tag of the pulled version, unless a tag of that name already points at another
    version here (left alone, and said in ``tags_not_set``)."""
    name, _, version = pulled.ref.rpartition(":v")
    here = repo.aliases(pulled.kind, name)
    tags, not_set = [], []
    for tag in sorted(a for a in set(aliases) if is_local_tag(a)):
        if here.get(tag, int(version)) != int(version):
            not_set.append(f"{tag}: already points at {name}:v{here[tag]} here")
            continue
        try:
            repo.tag(pulled.kind, pulled.ref, tag)
        except ModuleLensError as e:
            not_set.append(f"{tag}: {e.message}")
            continue
        tags.append(tag)
    return pulled.model_copy(update={"tags": tags, "tags_not_set": not_set})
