"""What crosses the pipes between the checker and a candidate process.

The checker sends a :data:`CandidateRequest` and reads one :data:`CandidateReply`: get ready
(:class:`ReadyRequest` -> :class:`Ready`: the harness has imported what it needs, before any
candidate code, so the checker can note what the process has mapped), load the
candidate (:class:`LoadRequest` -> :class:`Loaded`; a module-level candidate with
:class:`LoadModuleRequest`: its source runs, it is built with the captured constructor arguments
and loads the captured weights; the reference operator itself, for the symmetric timing of eager,
with :class:`LoadOpRequest`), call it on inputs in the shared arena (:class:`CallRequest`
-> :class:`Called`): once for a check, ``calls`` times for a timed batch, by the same function
either way (a timed call is a checked call: the checker verifies the outputs of random calls of
every timed batch, see :mod:`modulelens.validation.timed`), copy the last call's outputs into
the arena again (:class:`FetchRequest` -> :class:`Called`: after the checker rewrote the inputs,
an output that changed shares their memory), or the outputs of any one call of the last batch, load other parameters and buffers into a module
candidate (:class:`StateRequest` -> :class:`StateLoaded`), copy its buffers into the arena after
training calls (:class:`BuffersRequest` -> :class:`BuffersRead`), or deny the reference library before
any candidate code loads (:class:`DenyRequest` -> :class:`Denied`). Everything a candidate process reports is
a *claim* (its code may have rewritten the harness): the checker trusts only the bytes it reads
back from the arena and what it measures itself; ``ops`` is evidence, labelled as coming from the
candidate's side.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from modulelens.kernels import KernelSource
from modulelens.sandbox import Isolation, TensorSlot


class LoadRequest(BaseModel):
    kind: Literal["load"] = "load"
    candidate: KernelSource
    build_dir: str = Field(description="This candidate's own build folder (writable).")
    shared_build_dir: str | None = Field(None, description="The shared cache of finished builds (read-only).")
    compile_only: bool = False


class ReadyRequest(BaseModel):
    kind: Literal["ready"] = "ready"
    backend: str = Field(description="The candidate's backend: its runtime is imported now (part of the baseline).")


class LoadOpRequest(BaseModel):
    """Load the reference operator of a card (``aten.x.overload``) as the process's entry: called
    like a candidate (``positional`` arguments, then ``kw_names`` values passed by name), plain
    or through ``torch.compile`` (the compile baseline)."""

    kind: Literal["load_op"] = "load_op"
    op: str
    positional: int = Field(ge=0)
    kw_names: list[str] = Field(default_factory=list)
    compiled: bool = False


class LoadModuleRequest(BaseModel):
    """Load a module-level candidate (KernelBench ModelNew): run its source, build ``class_name``
    with the captured constructor arguments, load the captured weights by name (strict)."""

    kind: Literal["load_module"] = "load_module"
    source: str
    class_name: str = "ModelNew"
    init_args: list[Any] = Field(default_factory=list, description="Constructor argument specs (capture.values).")
    init_kwargs: dict[str, Any] = Field(default_factory=dict)
    init_tensors: str | None = Field(None, description="safetensors file (in scratch) of tensors the specs refer to.")
    state: str = Field(description="safetensors file (in scratch) of the original module's state dict.")
    sys_path: list[str] = Field(default_factory=list, description="Where the constructor's argument classes import from.")
    device: str = "cpu"
    shared_build_dir: str | None = Field(None, description="The build folder whose shared cache its load_inline "
                                         "extensions are taken from (read-only).")


class CallRequest(BaseModel):
    model_config = ConfigDict(ser_json_inf_nan="constants")

    kind: Literal["call"] = "call"
    arena_size: int
    args: list[Any] = Field(description="Encoded arguments (see shm.encode_value).")
    output_offset: int = Field(description="Where in the arena the outputs go.")
    poison_nbytes: list[int] = Field(default_factory=list, description="Blocks to fill with NaN and free first.")
    trace: bool = True
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Encoded keyword arguments (module calls).")
    training: bool | None = Field(None, description="Module calls: train (with grad) or eval (without); None: a card call.")
    rng: dict[str, Any] | None = Field(None, description="Encoded RNG states set right before the call (module calls).")
    grad_outputs: list[Any] | None = Field(
        None, description="Encoded output gradients: backward after the call, gradients returned (module calls).")
    calls: int = Field(1, ge=1, description="Calls in a row; before each after the first the floating inputs "
                       "get the swaps of `seed` (perturb.Swaps). The outputs in the reply are the last call's; "
                       "every call's outputs are kept until the next call request (see FetchRequest.call).")
    seed: int = Field(0, ge=0, description="Where the swaps between calls go.")
    threads: int | None = Field(None, ge=1, description="torch intra-op threads for the calls (None: leave).")


class FetchRequest(BaseModel):
    """Copy the outputs of the last call into the arena again (same slots), without calling; or,
    with ``call``, the outputs call ``call`` (0-based) of the last request returned (a timed
    batch's calls are verified after the fact, drawn by the checker once the batch answered)."""

    kind: Literal["fetch"] = "fetch"
    output_offset: int
    call: int | None = Field(None, ge=0, description="Which call of the last request (None: the last, with the "
                             "device copies of the inputs rewritten first).")


class StateRequest(BaseModel):
    """Load these parameters and buffers (encoded tensors in the arena) into the module candidate by
    name (``load_state_dict``, strict)."""

    kind: Literal["state"] = "state"
    state: dict[str, Any]


class BuffersRequest(BaseModel):
    """Copy these buffers of the module candidate (by state-dict name: running statistics, counters)
    into the arena from ``output_offset``, without calling it: what its training calls left there."""

    kind: Literal["buffers"] = "buffers"
    names: list[str]
    output_offset: int = 0


class DenyRequest(BaseModel):
    """Deny the reference library in this process, before any candidate code loads: every computing
    aten operator (and those of torch's other operator namespaces) raises; numpy's code is made
    unusable (``numpy="memory"``: its executable pages unmapped from use, its files unreadable, no
    page made executable again), or, for Triton's CPU interpreter which computes with numpy,
    denied to code outside torch, Triton and numpy itself (``numpy="python"``). ``keep``: base names
    of aten operators left usable (the library operators a module candidate declares it keeps)."""

    kind: Literal["deny"] = "deny"
    numpy: Literal["memory", "python"] = "memory"
    keep: list[str] = Field(default_factory=list)


CandidateRequest = Annotated[ReadyRequest | LoadRequest | LoadOpRequest | LoadModuleRequest | CallRequest
                             | FetchRequest | StateRequest | BuffersRequest | DenyRequest, Field(discriminator="kind")]
CANDIDATE_REQUESTS: TypeAdapter[CandidateRequest] = TypeAdapter(CandidateRequest)


class Ready(BaseModel):
    kind: Literal["ready"] = "ready"
    pid: int = Field(description="The process's own pid (in its namespace: 1).")


class Loaded(BaseModel):
    kind: Literal["loaded"] = "loaded"
    isolation: Isolation
    ok: bool
    error: str = Field("", description="Short compile error, usable in a repair prompt.")
    failed_step: Literal["load", "build"] = Field(
        "load", description="Module candidates: whether the source failed to load or the class to be built.")
    build_name: str | None = Field(None, description="Name of the extension the candidate was loaded from.")
    library: str | None = Field(None, description="Its file: in the candidate's folder, or in the shared cache.")
    fresh_build: bool = Field(False, description="Built now in the candidate's folder (to publish).")
    fresh_extensions: list[str] = Field(default_factory=list, description="Module candidates: names of the "
                                        "load_inline extensions built now (claimed; the checker finds them itself).")
    shared_extensions: list[str] = Field(default_factory=list, description="Module candidates: load_inline "
                                         "extensions taken from the shared build cache (claimed).")
    log_tail: str = ""


class Called(BaseModel):
    kind: Literal["called"] = "called"
    outputs: list[TensorSlot] = Field(default_factory=list)
    ops: list[str] | None = Field(None, description="aten ops the process ran during the call (claimed).")
    numpy_bridges: list[str] = Field(default_factory=list,
                                     description="torch<->numpy crossings made during the call (claimed).")
    input_grads: list[TensorSlot | None] = Field(default_factory=list, description="With grad_outputs: per tensor input.")
    param_grads: dict[str, TensorSlot] = Field(default_factory=dict, description="With grad_outputs: by parameter name.")
    error: str = ""
    out_of_memory: bool = False


class StateLoaded(BaseModel):
    kind: Literal["state_loaded"] = "state_loaded"
    error: str = ""


class BuffersRead(BaseModel):
    kind: Literal["buffers_read"] = "buffers_read"
    buffers: dict[str, TensorSlot] = Field(default_factory=dict, description="By state-dict name (claimed).")
    missing: list[str] = Field(default_factory=list, description="Names asked for that its state dict lacks.")
    error: str = ""


class Denied(BaseModel):
    kind: Literal["denied"] = "denied"
    operators: int = Field(description="Operator kernels replaced by one that raises (claimed).")
    numpy: str = Field(description="What was done to numpy and the other numerical libraries (claimed; the "
                       "checker reads the memory map itself).")
    layers: list[str] = Field(default_factory=list, description="Kernel-enforced layers added (claimed).")
    error: str = ""


CandidateReply = Annotated[Ready | Loaded | Called | StateLoaded | BuffersRead | Denied, Field(discriminator="kind")]
CANDIDATE_REPLIES: TypeAdapter[CandidateReply] = TypeAdapter(CandidateReply)
