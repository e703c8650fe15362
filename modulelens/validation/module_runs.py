"""Validate a stored module-level candidate in a sandbox worker: what ``validate_module`` and the
module level of ``optimize`` both run."""

from __future__ import annotations

from modulelens.kernels.backends.base import default_build_dir
from modulelens.kernels.module_candidates import ModuleCandidate, ModuleTarget
from modulelens.registry import ProgressFn
from modulelens.repo import Artifact, Repository
from modulelens.sandbox.pool import DEFAULT_MEMORY_LIMIT_MB
from modulelens.validation.messages import ModuleSource, ValidateModuleTask
from modulelens.validation.report import ValidationReport
from modulelens.validation.sandboxed import validate_in_sandbox


def _quiet(done: float, total: float | None = None, message: str | None = None) -> None:
    pass


def validate_stored_module(repo: Repository, art: Artifact, cand: ModuleCandidate, target: ModuleTarget, *,
                           time: bool = True, seeds: int = 2, rtol: float | None = None, atol: float | None = None,
                           timeout: float = 900.0, memory_limit_mb: int = DEFAULT_MEMORY_LIMIT_MB,
                           min_run_time: float | None = None,
                           progress: ProgressFn = _quiet) -> tuple[ValidationReport, Artifact]:
    """Validate the module candidate ``art`` against its capture; (report, stored report)."""
    task = ValidateModuleTask(
        repo=str(repo.root), capture=target.capture, build_dir=str(default_build_dir()),
        candidate=ModuleSource(source=cand.source, class_name=cand.class_name, claims_training=cand.claims_training),
        time=time, seeds=list(range(seeds)), rtol=rtol, atol=atol,
        memory_limit_mb=memory_limit_mb, call_timeout=timeout, build_timeout=timeout,
        **({"min_run_time": min_run_time} if min_run_time is not None else {}),
    )
    return validate_in_sandbox(repo, art, task, task.settings, backend="module", timeout=timeout,
                               memory_limit_mb=memory_limit_mb, progress=progress)
