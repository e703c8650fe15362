"""replay_module: rebuild a captured module alone and check it reproduces the captured outputs."""

from __future__ import annotations

import math
import time
from typing import Any, Literal

import torch
from pydantic import BaseModel, Field

from modulelens.capture.manifest import KIND, capture_manifest
from modulelens.capture.replay import LoadedCapture
from modulelens.capture.tracer import set_rng_states
from modulelens.capture.values import flatten, parse_dtype
from modulelens.errors import ModuleLensError, ReplayFailed
from modulelens.numerics import diff, tolerances
from modulelens.registry import Tool, ToolContext, register
from modulelens.repo import Repository


class ReplayModuleRequest(BaseModel):
    ref: str = Field(description="Capture reference: name, name:v3 or name@tag.", json_schema_extra={"cli": "argument"})
    strategy: Literal["auto", "source", "export", "pickle"] = Field(
        "auto", description="How to rebuild the module; auto tries source, export, then pickle (if trusted)."
    )
    device: str | None = Field(None, description="Run on this device (default: where it was captured).")
    dtype: str | None = Field(None, description="Cast floating weights and inputs to this dtype (e.g. bfloat16).")
    backward: bool = Field(False, description="Also run backward with the captured output gradient and compare "
                           "input and parameter gradients (needs a capture made with --backward).")
    trust_pickle: bool = Field(False, description="Allow the pickle strategy (runs code from the capture file).")
    rtol: float | None = Field(None, description="Relative tolerance (default: per dtype).")
    atol: float | None = Field(None, description="Absolute tolerance (default: per dtype).")


class TensorMatch(BaseModel):
    name: str
    shape: list[int]
    dtype: str
    max_abs_error: float
    max_rel_error: float
    allclose: bool
    detail: str = ""


class StrategyAttempt(BaseModel):
    strategy: str
    error: str


class ReplayModuleResult(BaseModel):
    ref: str
    strategy: str = Field(description="The strategy that ran.")
    attempts: list[StrategyAttempt] = Field(default_factory=list, description="Strategies tried before, and why they failed.")
    match: bool = Field(description="All outputs allclose to the captured ones (False when not comparable).")
    exact: bool = Field(description="All outputs bitwise equal to the captured ones.")
    compared: bool = Field(description="Whether outputs could be compared (not when inputs were synthesised).")
    max_abs_error: float
    max_rel_error: float
    rtol: float
    atol: float
    outputs: list[TensorMatch]
    synthesized_inputs: bool = Field(description="Some inputs or weights were synthesised from stored statistics.")
    synthesized: list[str] = Field(default_factory=list)
    reconstruction_seconds: float
    run_seconds: float
    device: str
    dtype: str | None
    backward: list[TensorMatch] | None = Field(None, description="Gradient comparisons when backward ran.")
    backward_match: bool | None = None
    notes: list[str] = Field(default_factory=list)


def _sync(device: str) -> None:
    if device.startswith("cuda") and torch.cuda.is_available():
        torch.cuda.synchronize()


def _compare(name: str, a: Any, e: Any, rtol: float | None, atol: float | None, dtype_cast: bool) -> TensorMatch:
    if not isinstance(a, torch.Tensor) or not isinstance(e, torch.Tensor):
        same = a == e if not isinstance(a, torch.Tensor) and not isinstance(e, torch.Tensor) else False
        return TensorMatch(name=name, shape=[], dtype=type(e).__name__, max_abs_error=0.0 if same else math.inf,
                           max_rel_error=0.0 if same else math.inf, allclose=bool(same),
                           detail="" if same else f"{a!r} != {e!r}")
    r, t = tolerances(a.dtype, e.dtype)
    d = diff(a, e, rtol if rtol is not None else r, atol if atol is not None else t, check_dtype=not dtype_cast)
    return TensorMatch(name=name, shape=list(e.shape), dtype=str(e.dtype).removeprefix("torch."),
                       max_abs_error=d.max_abs_error, max_rel_error=d.max_rel_error, allclose=d.allclose, detail=d.detail)


def _run(loaded: LoadedCapture, module: torch.nn.Module, backward: bool, device: str):
    args, kwargs = loaded.inputs()
    rng = loaded.rng()
    if rng:
        set_rng_states(rng)
    grad = loaded.manifest.grad_enabled or backward
    _sync(device)
    t0 = time.perf_counter()
    with torch.set_grad_enabled(grad):
        out = module(*args, **kwargs)
    _sync(device)
    return args, out, time.perf_counter() - t0


def _backward(loaded: LoadedCapture, module: torch.nn.Module, args: list[Any], out: Any, req: ReplayModuleRequest,
              dtype_cast: bool) -> list[TensorMatch]:
    info = loaded.manifest.backward
    if info is None:
        raise ReplayFailed(f"capture {loaded.artifact.ref} has no gradients", "capture again with --backward")
    grads = loaded.grads()
    outs = [t for t in flatten(out) if isinstance(t, torch.Tensor)]
    pairs = [(o, grads[f"grad_output.{i}"].to(o.device, o.dtype))
             for i, o in enumerate(outs) if f"grad_output.{i}" in grads and o.requires_grad]
    if not pairs:
        raise ReplayFailed("no replayed output requires grad", "replay in the capture's train/grad mode")
    torch.autograd.backward([p[0] for p in pairs], [p[1] for p in pairs])
    results = []
    for i, a in enumerate(args):
        key = f"grad_input.{i}"
        if key in grads and isinstance(a, torch.Tensor):
            got = a.grad if a.grad is not None else torch.zeros_like(a)
            results.append(_compare(key, got, grads[key], req.rtol, req.atol, dtype_cast))
    params = dict(module.named_parameters())
    for pname in info.param_grads:
        if pname in params:
            got = params[pname].grad
            got = got if got is not None else torch.zeros_like(params[pname])
            results.append(_compare(f"param.{pname}", got, grads[f"param.{pname}"], req.rtol, req.atol, dtype_cast))
    return results


def replay_module(req: ReplayModuleRequest, ctx: ToolContext) -> ReplayModuleResult:
    repo = Repository(ctx.repo_root)
    art = repo.open(KIND, req.ref)
    dtype = parse_dtype(req.dtype) if req.dtype else None
    device = req.device or capture_manifest(art).environment.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModuleLensError(f"device {device!r} is not available on this machine", "pass --device cpu")
    loaded = LoadedCapture(art, device=device, dtype=dtype)

    def run(module: torch.nn.Module):
        return module, *_run(loaded, module, req.backward, device)

    (module, args, out, run_s), strategy, build_s, tried = loaded.with_strategy(req.strategy, req.trust_pickle, run)
    attempts = [StrategyAttempt(strategy=s, error=e) for s, e in tried]
    expected, missing_outputs = loaded.expected_outputs()
    actual_leaves, expected_leaves = flatten(out), flatten(expected)
    notes = list(loaded.manifest.notes)
    outputs: list[TensorMatch] = []
    if len(actual_leaves) != len(expected_leaves):
        notes.append(f"the replay returned {len(actual_leaves)} values, the capture {len(expected_leaves)}")
        structure_ok = False
    else:
        structure_ok = True
        for i, (a, e) in enumerate(zip(actual_leaves, expected_leaves)):
            outputs.append(_compare(f"output.{i}", a, e, req.rtol, req.atol, dtype is not None))
    synthesized = sorted(set(loaded.synthesized))
    compared = structure_ok and not synthesized and not missing_outputs
    if synthesized:
        notes.append("inputs or weights were synthesised from stored statistics: outputs are not comparable")
    if missing_outputs:
        notes.append("captured outputs were stored shape-only: outputs are not comparable")
    match = compared and all(o.allclose for o in outputs)
    tensor_outs = [o for o in outputs if math.isfinite(o.max_abs_error) or not o.allclose]
    max_abs = max((o.max_abs_error for o in tensor_outs), default=0.0)
    max_rel = max((o.max_rel_error for o in tensor_outs), default=0.0)
    first = next((a for a in actual_leaves if isinstance(a, torch.Tensor)), None)
    rtol, atol = tolerances(first.dtype) if first is not None else (0.0, 0.0)
    backward = None
    if req.backward:
        backward = _backward(loaded, module, args, out, req, dtype is not None)
    return ReplayModuleResult(
        ref=art.ref, strategy=strategy, attempts=attempts, match=match,
        exact=compared and all(o.max_abs_error == 0.0 for o in outputs),
        compared=compared, max_abs_error=max_abs, max_rel_error=max_rel,
        rtol=req.rtol if req.rtol is not None else rtol, atol=req.atol if req.atol is not None else atol,
        outputs=outputs, synthesized_inputs=bool(synthesized), synthesized=synthesized,
        reconstruction_seconds=round(build_s, 6), run_seconds=round(run_s, 6), device=device,
        dtype=req.dtype, backward=backward,
        backward_match=None if backward is None else all(b.allclose for b in backward), notes=notes,
    )


TOOL = register(
    Tool(
        name="replay_module",
        request=ReplayModuleRequest,
        result=ReplayModuleResult,
        fn=replay_module,
        summary="Rebuild a captured module alone (source, export or pickle strategy), run it on the captured "
        "inputs and compare with the captured outputs (max abs/rel error, allclose); optionally backward.",
    )
)
