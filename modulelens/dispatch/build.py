"""Gather validated candidates into a pack file."""

from __future__ import annotations

from pathlib import Path

from modulelens.dispatch.pack import PackContent, PackEntry, current_environment, write_pack
from modulelens.dispatch.patterns import pattern_key
from modulelens.dispatch.sources import CandidateRecord, candidate_record
from modulelens.errors import ModuleLensError, tool_call
from modulelens.repo import Repository


def build_recipe(backend: str) -> dict:
    """How an entry's source is built where the pack is loaded."""
    if backend == "module":
        return {"builder": "the ModelNew source is executed; its load_inline extensions are loaded from the builds "
                           "validation verified (builds), or built before the script starts when missing"}
    from modulelens.kernels import get_backend

    return get_backend(backend).describe()


def _entry(rec: CandidateRecord, force: bool) -> PackEntry:
    if rec.report is None:
        raise ModuleLensError(f"candidate {rec.candidate_id} has not been validated",
                              f"validate it first: {tool_call('validate_kernel', candidate=rec.candidate_id)}")
    if not rec.report.correct or rec.report.verdict == "rejected":
        raise ModuleLensError(f"candidate {rec.candidate_id} was rejected: {rec.report.reason}",
                              "only candidates validated correct can be packed")
    rule = rec.report.shape_rule
    return PackEntry(candidate_id=rec.candidate_id, kind=rec.kind, target=rec.target, capture=rec.capture, op=rec.op,
                     class_path=rec.class_path, module_path=rec.module_path, pattern=rec.pattern, phase=rec.phase,
                     shape_rule=rule if rule is not None and rule.checked else None, backend=rec.backend,
                     entry=rec.entry, source=rec.source, source_sha256=rec.source_sha256,
                     build=build_recipe(rec.backend), init=rec.init, builds=list(rec.report.extensions), claims_training=rec.claims_training,
                     report=rec.report, speedup_vs_eager=rec.report.speedup_vs_eager,
                     speedup_interval=rec.report.speedup_interval, forced=force)


def make_pack(repo: Repository, candidate_ids: list[str], out: Path, force: bool = False) -> tuple[str, PackContent]:
    """Write the pack of ``candidate_ids`` to ``out``; returns (sha256, content). Two candidates
    for the same call pattern are refused (keep the faster one). An entry is used where the pack is
    loaded only when the lower bound of its speedup interval is above 1, unless ``force``
    (:meth:`PackEntry.skip_reason`)."""
    if not candidate_ids:
        raise ModuleLensError("no candidates given", f"e.g. {tool_call('pack', candidates=['blk.card2:v1', 'blk.card7:v1'], out='model.pack')}")
    entries = [_entry(candidate_record(repo, c), force) for c in candidate_ids]
    seen: dict[tuple, str] = {}
    for e in entries:
        where = (e.op or e.class_path, e.module_path, pattern_key(e.pattern))
        if where in seen:
            raise ModuleLensError(f"{seen[where]} and {e.candidate_id} are for the same call pattern",
                                  "pack one candidate per pattern (the faster one)")
        seen[where] = e.candidate_id
    content = PackContent(environment=current_environment({e.backend for e in entries}), entries=entries)
    return write_pack(out, content), content
