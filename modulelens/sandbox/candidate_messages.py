"""What crosses the pipes between the checker and a candidate process.

The checker sends a :data:`CandidateRequest` and reads one :data:`CandidateReply`: load the
candidate (:class:`LoadRequest` -> :class:`Loaded`), call it once on inputs in the shared arena
(:class:`CallRequest` -> :class:`Called`), or call it again N times on the same inputs for
timing (:class:`RepeatRequest` -> :class:`Repeated`). Everything a candidate process reports is
a *claim* (its code may have rewritten the harness): the checker trusts only the bytes it reads
back from the arena and what it measures itself; ``ops`` and ``aliases`` are evidence, labelled
as coming from the candidate's side.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from modulelens.kernels.source import KernelSource
from modulelens.sandbox.containment import Isolation
from modulelens.sandbox.shm import TensorSlot


class LoadRequest(BaseModel):
    kind: Literal["load"] = "load"
    candidate: KernelSource
    build_dir: str = Field(description="This candidate's own build folder (writable).")
    shared_build_dir: str | None = Field(None, description="The shared cache of finished builds (read-only).")
    compile_only: bool = False


class CallRequest(BaseModel):
    model_config = ConfigDict(ser_json_inf_nan="constants")

    kind: Literal["call"] = "call"
    arena_size: int
    args: list[Any] = Field(description="Encoded arguments (see shm.encode_value).")
    output_offset: int = Field(description="Where in the arena the outputs go.")
    poison_nbytes: list[int] = Field(default_factory=list, description="Blocks to fill with NaN and free first.")
    trace: bool = True


class RepeatRequest(BaseModel):
    kind: Literal["repeat"] = "repeat"
    calls: int = Field(ge=1)


CandidateRequest = Annotated[LoadRequest | CallRequest | RepeatRequest, Field(discriminator="kind")]
CANDIDATE_REQUESTS: TypeAdapter[CandidateRequest] = TypeAdapter(CandidateRequest)


class Loaded(BaseModel):
    kind: Literal["loaded"] = "loaded"
    isolation: Isolation
    ok: bool
    error: str = Field("", description="Short compile error, usable in a repair prompt.")
    build_name: str | None = Field(None, description="Name of the extension the candidate was loaded from.")
    library: str | None = Field(None, description="Its file: in the candidate's folder, or in the shared cache.")
    fresh_build: bool = Field(False, description="Built now in the candidate's folder (to publish).")
    log_tail: str = ""


class Called(BaseModel):
    kind: Literal["called"] = "called"
    outputs: list[TensorSlot] = Field(default_factory=list)
    aliases: list[int | None] = Field(default_factory=list, description="Input index each output views (claimed).")
    ops: list[str] | None = Field(None, description="aten ops the process ran during the call (claimed).")
    error: str = ""
    out_of_memory: bool = False


class Repeated(BaseModel):
    kind: Literal["repeated"] = "repeated"
    error: str = ""


CandidateReply = Annotated[Loaded | Called | Repeated, Field(discriminator="kind")]
CANDIDATE_REPLIES: TypeAdapter[CandidateReply] = TypeAdapter(CandidateReply)
