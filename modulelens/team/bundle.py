"""What a push sends: one stored version as a :class:`PushItem` (its files with their sha256, its
tags, its manifest, the versions it was made from), read from the local repository.

Inputs, by kind: an opset was recorded from a capture; an operator-card candidate implements a
card of an opset, a module candidate targets a capture; a report validates a candidate; a stats
run may come from a capture; a pack uses its candidates. A candidate is pushed with its latest report (when it has one), so
whoever pulls it sees how it validated.
"""

from __future__ import annotations

from modulelens.capture import KIND as CAPTURES
from modulelens.errors import ModuleLensError
from modulelens.kernels import CANDIDATES, CandidateManifest, ModuleCandidateManifest, is_module_candidate
from modulelens.ops import KIND as OPSETS
from modulelens.ops import OpSetManifest, parse_card_id
from modulelens.repo import MANIFEST, Artifact, Repository, sha256_file
from modulelens.stats.manifest import KIND as STATS
from modulelens.stats.manifest import StatsManifest
from modulelens.team.model import REMOTE_KINDS, LocalRef, PushItem, origin_alias
from modulelens.team.packs import PACKS, PackManifest, open_pack
from modulelens.validation import REPORTS, ReportManifest, report_name


def input_refs(art: Artifact) -> list[tuple[str, str]]:
    """(kind, reference) of each stored version ``art`` was made from, as its manifest names them."""
    if art.kind == OPSETS:
        capture = art.manifest_as(OpSetManifest).capture
        return [(CAPTURES, capture)] if capture else []
    if art.kind == CANDIDATES and is_module_candidate(art):
        return [(CAPTURES, art.manifest_as(ModuleCandidateManifest).target.capture)]
    if art.kind == CANDIDATES:
        return [(OPSETS, parse_card_id(art.manifest_as(CandidateManifest).target.card_id)[0])]
    if art.kind == REPORTS:
        return [(CANDIDATES, art.manifest_as(ReportManifest).candidate)]
    if art.kind == STATS:
        capture = art.manifest_as(StatsManifest).source.capture
        return [(CAPTURES, capture)] if capture else []
    if art.kind == PACKS:
        return [(CANDIDATES, candidate) for candidate in art.manifest_as(PackManifest).candidates]
    return []


def _local(art: Artifact) -> LocalRef:
    return LocalRef(kind=art.kind, ref=art.ref, name=art.name, version=art.version)


def _resolved_inputs(repo: Repository, art: Artifact) -> list[LocalRef]:
    """The inputs this repository still holds (an input deleted or never stored here is left out:
    its reference stays in the pushed manifest)."""
    out = []
    for kind, ref in input_refs(art):
        try:
            name, version = repo.resolve(kind, ref)
        except ModuleLensError:
            continue
        out.append(LocalRef(kind=kind, ref=f"{name}:v{version}", name=name, version=version))
    return out


def push_item(repo: Repository, art: Artifact) -> PushItem:
    """The push of one stored version. Every file is checked against its sha256 first, so a
    damaged version is refused here rather than shared."""
    for rel in art.base.files:
        art.file(rel)  # checks it against its sha256
    files = {**dict(sorted(art.base.files.items())), MANIFEST: sha256_file(art.path / MANIFEST)}
    tags = sorted(tag for tag, v in repo.aliases(art.kind, art.name).items() if v == art.version and tag != "latest")
    return PushItem(local=_local(art), folder=str(art.path), files=files, aliases=[*tags, origin_alias(art.version)],
                    metadata=art.raw_manifest, uses=_resolved_inputs(repo, art))


def push_items(repo: Repository, kind: str, ref: str) -> list[PushItem]:
    """What ``push REF`` sends: the version ``ref`` resolves to (for packs, ``ref`` may be a pack file:
    :func:`~modulelens.team.packs.open_pack`), then (for a candidate) its latest report."""
    if kind not in REMOTE_KINDS:
        raise ModuleLensError(f"cannot push {kind}", f"push one of: {', '.join(REMOTE_KINDS)}")
    art = open_pack(repo, ref) if kind == PACKS else repo.open(kind, ref)
    items = [push_item(repo, art)]
    if kind == CANDIDATES and repo.versions(REPORTS, report_name(art)):
        items.append(push_item(repo, repo.open(REPORTS, report_name(art))))
    return items
