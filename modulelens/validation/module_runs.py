"""Validate a stored module-level candidate in a sandbox worker: what ``validate_kernel`` (for a
ModelNew) and the module level of ``optimize`` both run."""

from __future__ import annotations

from modulelens.callbacks import ProgressFn
from modulelens.capture import KIND as CAPTURES
from modulelens.capture import capture_manifest
from modulelens.device import require
from modulelens.kernels import ModuleCandidate, ModuleTarget, default_build_dir
from modulelens.repo import Artifact, Repository
from modulelens.sandbox import DEFAULT_MEMORY_LIMIT_MB
from modulelens.validation.messages import ModuleSource, ValidateModuleTask
from modulelens.validation.module import readable_sys_path
from modulelens.validation.report import ValidationReport
from modulelens.validation.sandboxed import confinement, validate_in_sandbox


def _quiet(done: float, total: float | None = None, message: str | None = None) -> None:
    pass


def validate_stored_module(repo: Repository, art: Artifact, cand: ModuleCandidate, target: ModuleTarget, *,
                           device: str | None = None, time: bool = True, seeds: int = 2, rtol: float | None = None,
                           atol: float | None = None,
                           timeout: float = 900.0, memory_limit_mb: int = DEFAULT_MEMORY_LIMIT_MB,
                           progress: ProgressFn = _quiet) -> tuple[ValidationReport, Artifact]:
    """Validate the module candidate ``art`` against its capture (the checker confined to that
    trusted capture) on ``device`` (None: the captured device; the module, its state and its inputs
    are moved there on both sides); (report, stored report). A device this machine lacks is
    refused here, before a worker starts."""
    capture = repo.open(CAPTURES, target.capture)
    require(device or capture_manifest(capture).environment.device)
    # the checker builds the captured module: trusted captures only, checked here where the key is
    confine = confinement(repo, [capture], "validate a module candidate against it",
                          readable_sys_path(capture_manifest(capture).sys_path, repo.root))
    task = ValidateModuleTask(
        repo=str(repo.root), capture=target.capture, build_dir=str(default_build_dir()), confinement=confine,
        candidate=ModuleSource(source=cand.source, class_name=cand.class_name, claims_training=cand.claims_training),
        device=device, time=time, seeds=list(range(seeds)), rtol=rtol, atol=atol,
        memory_limit_mb=memory_limit_mb, call_timeout=timeout, build_timeout=timeout,
    )
    return validate_in_sandbox(repo, art, task, task.settings, backend="module", timeout=timeout,
                               memory_limit_mb=memory_limit_mb, progress=progress)
