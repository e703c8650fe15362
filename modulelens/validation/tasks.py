"""The task runner of validation workers (:data:`RUNNER`): what a sandbox worker started for
:data:`~modulelens.validation.messages.VALIDATION_WORKER` does with each task it reads."""

from __future__ import annotations

from collections.abc import Callable

from modulelens.sandbox.worker_messages import TaskRunner
from modulelens.validation import card
from modulelens.validation.messages import TASKS, RemeasureTask, SandboxResult, SandboxTask, ValidateModuleTask


def run_task(task: SandboxTask, stage: Callable[[str], None]) -> SandboxResult:
    """Run one validation task in this (worker) process: a module validation, finalists
    re-measured together, or a card task (card validation, timing, ping)."""
    if isinstance(task, ValidateModuleTask):
        from modulelens.validation import module  # only workers that validate modules need it

        return module.run_task(task, stage)
    if isinstance(task, RemeasureTask):
        from modulelens.validation.remeasure import remeasure

        return remeasure(task)
    return card.run_task(task, stage)


RUNNER = TaskRunner(tasks=TASKS, run=run_task)
