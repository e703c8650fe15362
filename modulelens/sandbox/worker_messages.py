"""What every sandbox worker speaks, whatever its tasks, and how a caller says what a worker runs.

A worker reads task frames and answers each task with :class:`StageReport` frames, then one
result: a :class:`WorkerResult` (subclassed by the caller's result kinds, each told apart by
``kind``). Two results belong to the sandbox itself: :class:`InternalErrorResult` (the task runner
raised: a bug, not a verdict) and :class:`CrashedResult` (the worker died or timed out: the pool
makes it; or the checker the worker forked for the task died: the worker sends it).

The sandbox knows nothing of what its tasks mean. A caller describes a kind of worker with a
:class:`WorkerKind`: the dotted path of a :class:`TaskRunner` object in modulelens's own code
(fixed by that caller, never taken from a candidate) and the TypeAdapter of the frames the worker
answers with.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter


class Message(BaseModel):
    """Base of every frame: floats JSON has no literal for travel as json.dumps writes them
    (Infinity, NaN), not as null."""

    model_config = ConfigDict(ser_json_inf_nan="constants")


class WorkerResult(Message):
    """Base of every result a worker answers a task with."""

    healthy: bool = Field(True, description="The worker's state is intact: it may take the next task.")
    stdout_bytes: int = Field(0, description="Bytes the worker wrote to its stdout during the task (set by the pool).")


class InternalErrorResult(WorkerResult):
    kind: Literal["internal_error"] = "internal_error"
    healthy: bool = False
    error: str = Field(description="Exception type and message.")
    traceback: str = ""


class CrashedResult(WorkerResult):
    """The worker (made by the pool) or the checker a worker forked for the task (sent by the worker,
    which is intact: ``healthy``) died or timed out."""

    kind: Literal["crashed"] = "crashed"
    healthy: bool = False
    reason: str = Field(description="What happened to the worker: 'crashed with SIGSEGV', 'timed out after 20 s', ...")
    stage: str | None = Field(None, description="The last stage the worker reported.")
    stderr_tail: str = ""


class StageReport(Message):
    kind: Literal["stage"] = "stage"
    stage: str


@dataclass(frozen=True)
class TaskRunner:
    """What runs inside a worker: ``tasks`` reads one task frame; ``run(task, stage)`` does the
    task, calling ``stage(name)`` as it reaches each stage, and returns its :class:`WorkerResult`.
    ``preload``: modules inside modulelens the worker imports before it forks anything (the
    candidate harness among them: see :func:`modulelens.sandbox.forkserver.preload`)."""

    tasks: TypeAdapter[Any]
    run: Callable[[Any, Callable[[str], None]], WorkerResult]
    preload: tuple[str, ...] = ()


@dataclass(frozen=True)
class WorkerKind:
    """A kind of sandbox worker. ``runner``: ``package.module:NAME`` of a :class:`TaskRunner`
    inside modulelens (the worker imports it after setting its limits); ``replies``: the TypeAdapter
    of what the worker answers (:class:`StageReport` frames and the runner's results)."""

    runner: str
    replies: TypeAdapter[Any]
