"""What crosses a validation worker's pipes: tasks to the worker, and its stage reports and results.

Both sides live here: the caller sends a :data:`SandboxTask` and reads :data:`WorkerMessage`
frames (read with :data:`WORKER_MESSAGES`) until a result; the worker (:data:`VALIDATION_WORKER`,
whose runner is :data:`modulelens.validation.tasks.RUNNER`) reads tasks with :data:`TASKS` and
answers with :class:`~modulelens.sandbox.worker_messages.StageReport` frames, then one result.
Frames travel as model JSON over :mod:`modulelens.sandbox.protocol`. Every result kind is its own
model, told apart by ``kind``, so a caller matches on the type instead of probing keys:

* :class:`ValidatedResult`: a validation ran to a verdict (a rejection is a verdict too);
* :class:`TimedResult`: a candidate was timed;
* :class:`RemeasuredResult`: finalists were timed together against eager;
* :class:`RefusedResult`: the task could not be done here (a ``ModuleLensError``: message and hint);
* :class:`PongResult`: answer to a :class:`PingTask`;
* :class:`InternalErrorResult` (the sandbox's): modulelens itself failed inside the worker (a bug);
* :class:`CrashedResult` (the sandbox's): the worker died or timed out (the pool makes it), or the
  checker process the worker forked for the task died (the worker sends it).
"""

from __future__ import annotations

import errno
from typing import Annotated, Literal

from pydantic import BaseModel, Field, TypeAdapter

from modulelens.kernels import KernelSource
from modulelens.sandbox import (
    CrashedResult,
    InternalErrorResult,
    Message,
    StageReport,
    WorkerKind,
    WorkerResult,
)
from modulelens.timing import SpeedupMeasurement, Timing
from modulelens.validation import VALIDATION_RUNNER
from modulelens.validation.report import ModuleValidationSettings, ValidationReport, ValidationSettings

# -- tasks -------------------------------------------------------------------------------------

class TrustedInput(BaseModel):
    """An artifact the caller found trusted (signed with this machine's key, which the checker does
    not hold): trusted in the checker while its manifest's bytes keep this sha256."""

    path: str
    manifest_sha256: str


class Confinement(BaseModel):
    """What the checker may reach, decided by the caller (see :func:`modulelens.validation.tasks.confine`)."""

    inputs: list[TrustedInput] = Field(default_factory=list, description="The task's input artifacts (read-only).")
    readable: list[str] = Field(default_factory=list, description="Other folders it reads (a capture's sys_path).")
    secrets: dict[str, str] = Field(default_factory=dict,
                                    description="What -> path the checker proves it cannot open (key, repository).")


class CandidateTask(Message):
    """A candidate to run against a card of the repository at ``repo``."""

    repo: str = Field(description="Root of the repository holding the card.")
    candidate: KernelSource
    build_dir: str = Field(description="Where compiled candidates are cached.")
    confinement: Confinement | None = Field(None, description="None: the checker runs unconfined (and trusts nothing).")


class CandidateLimits(BaseModel):
    """The limits of a candidate process."""

    memory_limit_mb: int = Field(6144, ge=256, description="Address-space cap of the candidate process (CPU runs).")
    call_timeout: float = Field(120.0, gt=0, description="Seconds one request to the candidate process may take.")
    build_timeout: float = Field(900.0, gt=0, description="Seconds compiling the candidate may take.")


class ValidateCardTask(CandidateTask, ValidationSettings, CandidateLimits):
    kind: Literal["validate_card"] = "validate_card"

    @property
    def settings(self) -> ValidationSettings:
        """The part of the task stored with its report."""
        return ValidationSettings.model_validate(self.model_dump(include=set(ValidationSettings.model_fields)))


class TimeCandidateTask(CandidateTask):
    """Time the candidate alone on its card's first stored sample."""

    kind: Literal["time_candidate"] = "time_candidate"
    card_id: str
    device: str | None = None
    min_run_time: float = Field(0.5, gt=0)
    warmup: int = Field(3, ge=0)


class ModuleSource(Message):
    """A module-level candidate: Python source defining ``class_name`` (the KernelBench ModelNew contract)."""

    backend: Literal["module"] = "module"
    source: str
    class_name: str = "ModelNew"
    claims_training: bool = False


class ValidateModuleTask(Message, ModuleValidationSettings, CandidateLimits):
    """Validate a module-level candidate against the capture ``capture`` of the repository at ``repo``."""

    kind: Literal["validate_module"] = "validate_module"
    repo: str
    candidate: ModuleSource
    build_dir: str
    confinement: Confinement | None = None

    @property
    def settings(self) -> ModuleValidationSettings:
        """The part of the task stored with its report."""
        return ModuleValidationSettings.model_validate(self.model_dump(include=set(ModuleValidationSettings.model_fields)))


class RemeasureTask(Message, CandidateLimits):
    """Time validated candidates of one card against eager together, in the same interleaved rounds
    (optimize's finalists): see :mod:`modulelens.validation.remeasure`."""

    kind: Literal["remeasure"] = "remeasure"
    repo: str
    card_id: str
    candidates: list[KernelSource]
    build_dir: str
    confinement: Confinement | None = None
    device: str | None = None
    min_run_time: float = Field(0.6, gt=0)
    timing_budget_s: float = Field(6.0, gt=0)
    target_width: float = Field(0.2, gt=0)


class PingTask(Message):
    kind: Literal["ping"] = "ping"


SandboxTask = Annotated[ValidateCardTask | ValidateModuleTask | TimeCandidateTask | RemeasureTask | PingTask,
                        Field(discriminator="kind")]
TASKS: TypeAdapter[SandboxTask] = TypeAdapter(SandboxTask)


# -- results -----------------------------------------------------------------------------------

class ValidatedResult(WorkerResult):
    kind: Literal["validated"] = "validated"
    report: ValidationReport


class TimedResult(WorkerResult):
    kind: Literal["timed"] = "timed"
    timing: Timing


class RemeasuredResult(WorkerResult):
    kind: Literal["remeasured"] = "remeasured"
    measurements: list[SpeedupMeasurement | None] = Field(description="Per candidate, in task order; null: not measured.")
    reasons: list[str] = Field(description="Per candidate: why it was not measured (empty when it was).")


class RefusedResult(WorkerResult):
    kind: Literal["refused"] = "refused"
    message: str
    hint: str | None = None


def out_of_memory(e: BaseException) -> bool:
    """``e`` is the checker running out of memory (Python's or torch's allocator, or a mapping)."""
    return (isinstance(e, MemoryError) or (isinstance(e, RuntimeError) and "can't allocate memory" in str(e))
            or (isinstance(e, OSError) and e.errno == errno.ENOMEM))


def memory_refusal(task: CandidateLimits, what: str, data_bytes: int | None) -> RefusedResult:
    """The answer when the checker ran out of memory validating ``what``: which limit, how big the
    data compared is (when known), and how to raise the limit."""
    size = f"its inputs and outputs take {data_bytes / 2**20:.0f} MiB; " if data_bytes else ""
    return RefusedResult(
        message=f"validating {what} needs more memory than the limit of {task.memory_limit_mb} MB ({size}the checker "
                "holds the original's outputs, the candidate's and their comparison)",
        hint=f"raise it with [--memory-limit-mb {2 * task.memory_limit_mb}]", healthy=False)


class PongResult(WorkerResult):
    kind: Literal["pong"] = "pong"


SandboxResult = Annotated[
    ValidatedResult | TimedResult | RemeasuredResult | RefusedResult | PongResult | InternalErrorResult
    | CrashedResult,
    Field(discriminator="kind"),
]


# -- frames on the result pipe -----------------------------------------------------------------

WorkerMessage = Annotated[
    StageReport | ValidatedResult | TimedResult | RemeasuredResult | RefusedResult | PongResult | InternalErrorResult
    | CrashedResult,
    Field(discriminator="kind"),
]
WORKER_MESSAGES: TypeAdapter[WorkerMessage] = TypeAdapter(WorkerMessage)

VALIDATION_WORKER = WorkerKind(runner=VALIDATION_RUNNER, replies=WORKER_MESSAGES)
"""The sandbox worker that validates and times candidates."""
