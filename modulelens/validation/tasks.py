"""The task runner of validation workers (:data:`RUNNER`): what the checker a sandbox worker forks
for each task (see :mod:`modulelens.sandbox.worker`) does with the task it reads.

Before anything else the checker confines itself (:func:`confine`), from what the task says it
needs: it holds no signing key (trust was checked by the caller, which names the artifacts it
verified by their manifests' sha256), reads only system and Python folders, the task's input
artifacts, the folders a capture's classes import from and the build cache, and writes only its
scratch, the candidates' scratch folders and the build cache's publish folder. Its layers go into
every report's ``isolation`` next to the candidate's."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from modulelens.capture import REPLAY_RUNTIME
from modulelens.kernels import publish_dir
from modulelens.repo import accept_verified, forbid_key
from modulelens.sandbox import CHECKER, Layer, TaskRunner, confine_checker
from modulelens.validation import card, checker
from modulelens.validation.messages import (
    TASKS,
    PingTask,
    RemeasureTask,
    SandboxResult,
    SandboxTask,
    ValidateModuleTask,
)


def confine(task: SandboxTask) -> list[Layer]:
    """Confine this (checker) process for ``task`` and accept the artifacts its caller verified;
    the layers in force, named ``checker: ...``."""
    forbid_key()
    conf = getattr(task, "confinement", None)
    if conf is None:
        return [Layer(name=CHECKER + "landlock", in_force=False, detail="the caller gave no confinement")]
    for item in conf.inputs:
        accept_verified(Path(item.path), item.manifest_sha256)
    checker.SECRETS.clear()
    checker.SECRETS.update({what: Path(path) for what, path in conf.secrets.items()})
    build = Path(task.build_dir)
    publish = publish_dir(build)
    scratch_parent = checker.candidates_folder()
    scratch_parent.mkdir(parents=True, exist_ok=True)
    publish.mkdir(parents=True, exist_ok=True)
    home = os.environ.get("HOME", "")
    from modulelens.profiling.bandwidth import _cache_file

    readable = [item.path for item in conf.inputs] + list(conf.readable) + [str(publish)]
    if _cache_file().is_file():
        readable.append(str(_cache_file()))
    writable = [p for p in (home, str(publish), str(scratch_parent)) if p]
    return confine_checker(readable, writable, conf.secrets)


def run_task(task: SandboxTask, stage: Callable[[str], None]) -> SandboxResult:
    """Run one validation task in this (checker) process: a module validation, finalists
    re-measured together, or a card task (card validation, timing, ping), after :func:`confine`."""
    if not isinstance(task, PingTask):
        checker.CHECKER_LAYERS[:] = confine(task)
    if isinstance(task, ValidateModuleTask):
        from modulelens.validation import module  # only workers that validate modules need it

        return module.run_task(task, stage)
    if isinstance(task, RemeasureTask):
        from modulelens.validation.remeasure import remeasure

        return remeasure(task)
    return card.run_task(task, stage)


RUNNER = TaskRunner(tasks=TASKS, run=run_task,
                    preload=(checker.HARNESS, "modulelens.validation.module", *REPLAY_RUNTIME))
