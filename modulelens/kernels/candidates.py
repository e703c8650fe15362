"""Candidates and their validation reports in the repository.

A candidate for card ``blk:v1/6`` is stored as ``candidates/blk.card6/vN`` (candidate id
``blk.card6:vN``) with its source file; each validation of it is a version of
``reports/blk.card6.vN``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from modulelens.kernels.report import ValidationReport
from modulelens.kernels.source import KernelSource
from modulelens.repo import Artifact, Repository

CANDIDATES = "candidates"
REPORTS = "reports"
_SUFFIX = {"cpp": "cpp", "cuda": "cu", "triton": "py"}


def candidate_name(card_id: str) -> str:
    opset_ref, _, index = card_id.rpartition("/")
    return f"{opset_ref.split(':')[0].split('@')[0]}.card{index}"


def save_candidate(repo: Repository, card_id: str, card: dict[str, Any], src: KernelSource,
                   parent: str | None = None) -> Artifact:
    filename = f"kernel.{_SUFFIX[src.backend]}"

    def write(folder: Path) -> dict[str, Any]:
        (folder / filename).write_text(src.source)
        return {
            "target": {"card_id": card_id, "op": card["op"], "shapes": card["shapes"], "dtypes": card["dtypes"],
                       "kind": card["kind"]},
            "backend": src.backend, "entry": src.entry, "family": src.family, "params": src.params,
            "provider": src.provider, "provenance": src.provenance, "parent": parent, "source_file": filename,
            "source_sha256": src.sha256,
        }

    return repo.create(CANDIDATES, candidate_name(card_id), write)


def load_candidate(repo: Repository, candidate_id: str) -> tuple[Artifact, KernelSource]:
    art = repo.open(CANDIDATES, candidate_id)
    m = art.manifest
    src = KernelSource(backend=m["backend"], source=art.file(m["source_file"]).read_text(), entry=m["entry"],
                       family=m.get("family"), params=m.get("params", {}), provider=m["provider"],
                       provenance=m.get("provenance", {}))
    return art, src


def report_name(candidate: Artifact) -> str:
    return f"{candidate.name}.v{candidate.version}"


def save_report(repo: Repository, candidate: Artifact, report: ValidationReport, settings: dict[str, Any]) -> Artifact:
    def write(folder: Path) -> dict[str, Any]:
        (folder / "report.json").write_text(report.model_dump_json(indent=2))
        return {"candidate": candidate.ref, "verdict": report.verdict, "correct": report.correct,
                "speedup_vs_eager": report.speedup_vs_eager, "settings": settings}

    return repo.create(REPORTS, report_name(candidate), write)


def latest_report(repo: Repository, candidate: Artifact) -> ValidationReport | None:
    name = report_name(candidate)
    if not repo.versions(REPORTS, name):
        return None
    art = repo.open(REPORTS, name)
    return ValidationReport.model_validate(art.read_json("report.json"))
