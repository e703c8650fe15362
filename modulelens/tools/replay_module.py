"""replay_module: rebuild a captured module alone and check it reproduces the captured outputs."""

from __future__ import annotations

import math
import time
from typing import Any, Literal

import torch
from pydantic import BaseModel, Field

from modulelens.capture import (
    BUFFER_PREFIX,
    KIND,
    CaptureManifest,
    LoadedCapture,
    TensorSpec,
    autocast_regions,
    capture_manifest,
    describe_settings,
    flatten,
    keyed_tensors,
    keyed_values,
    layout_differences,
    parse_dtype,
    recorded_settings,
    replayed_state,
    set_rng_states,
)
from modulelens.device import is_cuda, processor_name, require, synchronize
from modulelens.errors import ModuleLensError, ReplayFailed, arg
from modulelens.numerics import diff, short_repr, tolerances
from modulelens.ops import CardReplay, replay_card
from modulelens.registry import ToolContext, tool
from modulelens.replies import ToolReply, call
from modulelens.repo import Repository


class ReplayModuleRequest(BaseModel):
    ref: str = Field(description="Capture ref, or a card id (its operator alone).",
                     json_schema_extra={"cli": "argument"})
    strategy: Literal["auto", "source", "export", "pickle"] = Field(
        "auto", description="auto: source, export, then pickle."
    )
    device: str | None = Field(None, description="Default: the captured one.")
    dtype: str | None = Field(None, description="Cast weights and inputs (e.g. bfloat16).")
    backward: bool = Field(False, description="Also compare gradients.")
    trust_pickle: bool = Field(False, description="Allow the pickle strategy.")
    rtol: float | None = Field(None, ge=0, description="Default: per dtype.")
    atol: float | None = Field(None, ge=0, description="Default: per dtype.")
    sample: int = Field(0, ge=0, description="Card: which stored sample.")


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


class ReplayModuleResult(ToolReply):
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
    tolerance_dtype: str | None = Field(
        None, description="The dtype whose default tolerances rtol and atol are: the loosest of the first output's "
        "dtype and the dtypes the replay computes in (a module computing in bfloat16 that returns float32 is judged "
        "with bfloat16's); null when rtol and atol were both given.")
    outputs: list[TensorMatch]
    state: list[TensorMatch] = Field(default_factory=list, description="State the forward changed (inputs changed in "
                                     "place or replaced, as caches are; buffers such as running statistics), compared "
                                     "after the replay.")
    compared_values: list[str] = Field(default_factory=list, description="What was compared, in words.")
    synthesized_inputs: bool = Field(description="Some inputs or weights were synthesised from stored statistics.")
    synthesized: list[str] = Field(default_factory=list)
    reconstruction_seconds: float
    run_seconds: float
    device: str
    dtype: str | None
    backward: list[TensorMatch] | None = Field(None, description="Gradient comparisons when backward ran.")
    backward_match: bool | None = None
    notes: list[str] = Field(default_factory=list)


def compute_dtypes(manifest: CaptureManifest, cast: torch.dtype | None) -> tuple[torch.dtype, ...]:
    """The floating dtypes a replay computes in: ``cast`` when the replay casts (else the captured
    weights' and inputs'), and the captured autocast regions'. Every comparison takes the loosest
    tolerance among these and the compared tensors' own dtypes."""
    found = {cast} if cast is not None else {
        parse_dtype(t.dtype) for t in [*manifest.weight_specs().values(), *manifest.inputs.tensor_leaves()]}
    found |= {parse_dtype(d) for d in manifest.autocast.values()}
    return tuple(sorted((d for d in found if d.is_floating_point), key=str))


def loosest_dtype(dtypes: tuple[torch.dtype, ...]) -> torch.dtype | None:
    """The floating dtype among ``dtypes`` with the loosest default tolerance (None when none is floating)."""
    floating = [d for d in dtypes if d.is_floating_point]
    return max(floating, key=lambda d: tolerances(d), default=None)


def _compare(name: str, a: Any, e: Any, rtol: float | None, atol: float | None, dtype_cast: bool,
             compute: tuple[torch.dtype, ...] = ()) -> TensorMatch:
    if not isinstance(a, torch.Tensor) or not isinstance(e, torch.Tensor):
        same = a == e if not isinstance(a, torch.Tensor) and not isinstance(e, torch.Tensor) else False
        return TensorMatch(name=name, shape=[], dtype=type(e).__name__, max_abs_error=0.0 if same else math.inf,
                           max_rel_error=0.0 if same else math.inf, allclose=bool(same),
                           detail="" if same else f"{short_repr(a)} != {short_repr(e)}")
    r, t = tolerances(a.dtype, e.dtype, *compute)
    d = diff(a, e, rtol if rtol is not None else r, atol if atol is not None else t, check_dtype=not dtype_cast)
    return TensorMatch(name=name, shape=list(e.shape), dtype=str(e.dtype).removeprefix("torch."),
                       max_abs_error=d.max_abs_error, max_rel_error=d.max_rel_error, allclose=d.allclose, detail=d.detail)


def _run(loaded: LoadedCapture, module: torch.nn.Module, backward: bool, device: str):
    args, kwargs = loaded.inputs()
    rng = loaded.rng()
    if rng:
        set_rng_states(rng)
    grad = loaded.manifest.grad_enabled or backward
    synchronize(device)
    t0 = time.perf_counter()
    with torch.set_grad_enabled(grad), autocast_regions(loaded.manifest.autocast):
        out = module(*args, **kwargs)
    synchronize(device)
    return (args, kwargs), out, time.perf_counter() - t0


def _backward(loaded: LoadedCapture, module: torch.nn.Module, args: list[Any], out: Any, req: ReplayModuleRequest,
              dtype_cast: bool, compute: tuple[torch.dtype, ...]) -> list[TensorMatch]:
    info = loaded.manifest.backward
    if info is None:
        raise ReplayFailed(f"capture {loaded.artifact.ref} has no gradients", "capture again with [--backward]")
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
            a = loaded.input_leaves.get(id(a), a)  # an input given as an activation: its leaf's gradient
            got = a.grad if a.grad is not None else torch.zeros_like(a)
            results.append(_compare(key, got, grads[key], req.rtol, req.atol, dtype_cast, compute))
    params = dict(module.named_parameters())
    for pname in info.param_grads:
        if pname in params:
            got = params[pname].grad
            got = got if got is not None else torch.zeros_like(params[pname])
            results.append(_compare(f"param.{pname}", got, grads[f"param.{pname}"], req.rtol, req.atol, dtype_cast,
                                    compute))
    return results


def _compare_keyed(actual: dict[str, torch.Tensor], specs: dict[str, TensorSpec], expected: dict[str, torch.Tensor],
                   req: ReplayModuleRequest, dtype_cast: bool, compute: tuple[torch.dtype, ...], notes: list[str],
                   what: str) -> tuple[list[TensorMatch], bool]:
    """Compare replayed tensors with the stored ones by key; notes what is missing on either side.
    Returns the comparisons and whether the keys matched."""
    lost = [k for k in specs if k not in actual]
    extra = [k for k in actual if k not in specs]
    if lost or extra:
        notes.append(f"the replay's {what} tensors differ from the capture's: "
                     + ", ".join([*(f"missing {k}" for k in lost[:3]), *(f"unexpected {k}" for k in extra[:3])]))
    matches = [_compare(key, actual[key], expected[key], req.rtol, req.atol, dtype_cast, compute)
               for key in specs if key in actual and key in expected]
    return matches, not lost and not extra


def _what_was_compared(outputs: list[TensorMatch], state: list[TensorMatch]) -> list[str]:
    said = [f"{len(outputs)} output tensor(s)"]
    inputs = [s.name for s in state if not s.name.startswith(BUFFER_PREFIX)]
    buffers = [s.name[len(BUFFER_PREFIX):] for s in state if s.name.startswith(BUFFER_PREFIX)]
    if inputs:
        said.append(f"{len(inputs)} input tensor(s) the forward changed: {', '.join(inputs[:5])}")
    if buffers:
        said.append(f"{len(buffers)} buffer(s) the forward changed: {', '.join(buffers[:5])}")
    return said


def _mismatch_note(rtol: float, atol: float, dtype: torch.dtype | None, compute: tuple[torch.dtype, ...],
                   given: bool) -> str:
    """Why a replay that ran does not match, naming the tolerances it was judged by."""
    if given:
        return f"outputs differ beyond the given tolerances (rtol {rtol:g}, atol {atol:g})"
    if dtype is None:
        return "outputs differ from the captured ones (non-tensor values compare exactly)"
    name = str(dtype).removeprefix("torch.")
    computed = ", ".join(str(d).removeprefix("torch.") for d in compute) or "the outputs' dtypes"
    return (f"outputs differ beyond the {name} tolerances (rtol {rtol:g}, atol {atol:g}), the loosest for the dtypes "
            f"the replay computes in ({computed}) and the outputs'; pass rtol and atol to judge with others")


def _elsewhere_notes(manifest: CaptureManifest, device: str) -> list[str]:
    """Why a replay that is not bit for bit may still be right: the call ran on another processor
    or with another number of threads, where libraries round differently."""
    env, notes = manifest.environment, []
    here = processor_name(device)
    if env.processor and here and env.processor != here:
        notes.append(f"captured on {env.processor}, replayed on {here}: BLAS and vectorised kernels choose code "
                     "per processor, so results can differ in the last bits; replay on the capture's machine for "
                     "bit-for-bit equality")
    threads = torch.get_num_threads()
    if env.num_threads and env.num_threads != threads and not is_cuda(device):
        notes.append(f"captured with {env.num_threads} CPU threads, replayed with {threads}: reductions split "
                     f"differently; set OMP_NUM_THREADS={env.num_threads} for bit-for-bit equality")
    return notes


_ABSENT = "<absent>"


_CAPTURE_ONLY = ("strategy", "device", "dtype", "backward", "trust_pickle", "rtol", "atol")


def _replay_card(repo: Repository, req: ReplayModuleRequest) -> CardReplay:
    """The card's operator alone on its stored sample (a card id given as ``ref``)."""
    given = [name for name in _CAPTURE_ONLY if name in req.model_fields_set]
    if given:
        raise ModuleLensError(f"{', '.join(arg(n) for n in given)} go with a capture ref, not a card id",
                              "a card's operator replays on its stored sample as recorded; give [--sample N] only")
    result = replay_card(repo, req.ref, req.sample)
    if result.synthesized_inputs:
        result.warnings.append("inputs were synthesised from stored statistics: the output is not comparable")
    if not result.values_compared:
        result.warnings.append("the operator returns uninitialised memory: only shapes and dtypes were compared")
    result.next = [call("generate_kernel", card=result.card_id)]
    return result


@tool
def replay_module(req: ReplayModuleRequest, ctx: ToolContext) -> ReplayModuleResult | CardReplay:
    """Rebuild a captured module (or a card's operator) alone, rerun the call, compare outputs."""
    repo = Repository(ctx.repo_root)
    if "/" in req.ref:
        return _replay_card(repo, req)
    if "sample" in req.model_fields_set:
        raise ModuleLensError("[--sample] goes with a card id (blk/6), not a capture ref",
                              "a capture replays its one captured call")
    art = repo.open(KIND, req.ref)
    dtype = parse_dtype(req.dtype) if req.dtype else None
    device = require(req.device or capture_manifest(art).environment.device)
    loaded = LoadedCapture(art, device=device, dtype=dtype)

    def run(module: torch.nn.Module):
        return module, *_run(loaded, module, req.backward, device)

    numerics = loaded.manifest.environment.numerics
    with recorded_settings(numerics) as changed:
        (module, args, out, run_s), strategy, build_s, tried = loaded.with_strategy(req.strategy, req.trust_pickle, run)
    attempts = [StrategyAttempt(strategy=s, error=e) for s, e in tried]
    notes = list(loaded.manifest.notes)
    if changed:
        notes.append(f"replayed under the capture's numeric settings: {describe_settings(changed)}")
    stored = loaded.manifest.activations
    if stored is not None and stored.mode != "full":
        notes.append(f"replayed on what the capture stored ({stored.mode}): {stored.reason}")
    dtype_cast = dtype is not None
    _, actual = keyed_tensors(out, "output")
    expected_specs = {t.key: t for t in loaded.manifest.output_leaves()}
    missing_outputs = [k for k, t in expected_specs.items() if not t.stored]
    expected = loaded.expected_tensors("outputs.safetensors", [k for k, t in expected_specs.items() if t.stored])
    compute = compute_dtypes(loaded.manifest, dtype)
    outputs, structure_ok = _compare_keyed(actual, expected_specs, expected, req, dtype_cast, compute, notes, "output")
    notes += [f"output layout: {d}" for d in layout_differences(expected_specs, actual)]
    captured_values = loaded.expected_values()
    replayed_values = keyed_values(out, "output")
    for key, want in captured_values.items():
        if key not in expected_specs:
            outputs.append(_compare(key, replayed_values.get(key, _ABSENT), want, req.rtol, req.atol, dtype_cast,
                                    compute))
    state_specs = loaded.manifest.state_specs()
    state, _ = _compare_keyed(
        {k: v for k, v in replayed_state(module, args[0], args[1]).items() if k in state_specs}, state_specs,
        loaded.expected_tensors("state.safetensors", [k for k, t in state_specs.items() if t.stored]),
        req, dtype_cast, compute, notes, "state")
    synthesized = sorted(set(loaded.synthesized))
    compared = structure_ok and not synthesized and not missing_outputs
    if synthesized:
        notes.append("inputs or weights were synthesised from stored statistics: outputs are not comparable")
    if missing_outputs:
        notes.append("captured outputs were stored shape-only: outputs are not comparable")
    match = compared and all(o.allclose for o in outputs + state)
    tensor_outs = [o for o in outputs + state if math.isfinite(o.max_abs_error) or not o.allclose]
    max_abs = max((o.max_abs_error for o in tensor_outs), default=0.0)
    max_rel = max((o.max_rel_error for o in tensor_outs), default=0.0)
    actual_leaves = list(actual.values())
    first = next(iter(actual_leaves), None)
    given = req.rtol is not None and req.atol is not None
    judged_by = loosest_dtype((first.dtype, *compute)) if first is not None and not given else None
    default_rtol, default_atol = tolerances(judged_by) if judged_by is not None else (0.0, 0.0)
    rtol = req.rtol if req.rtol is not None else default_rtol
    atol = req.atol if req.atol is not None else default_atol
    if compared and not match:
        notes.append(_mismatch_note(rtol, atol, judged_by, compute, given))
    if compared and not all(o.max_abs_error == 0.0 for o in outputs + state):
        notes += _elsewhere_notes(loaded.manifest, device)
    backward = None
    if req.backward:
        with recorded_settings(numerics):
            backward = _backward(loaded, module, args[0], out, req, dtype is not None, compute)
    warnings = [f"not compared: {n}" for n in notes if "not comparable" in n]
    if compared and not match:
        warnings.append(f"outputs differ from the captured ones (max abs error {max_abs:.3g}); see notes")
    warnings += [f"strategy {a.strategy} failed first: {a.error[:160]}" for a in attempts[:2]]
    return ReplayModuleResult(
        warnings=warnings, next=[call("capture_ops", ref=art.ref), call("export_repro", ref=art.ref)],
        ref=art.ref, strategy=strategy, attempts=attempts, match=match,
        exact=compared and all(o.max_abs_error == 0.0 for o in outputs + state),
        state=state, compared_values=_what_was_compared(outputs, state),
        compared=compared, max_abs_error=max_abs, max_rel_error=max_rel,
        rtol=rtol, atol=atol, tolerance_dtype=str(judged_by).removeprefix("torch.") if judged_by else None,
        outputs=outputs, synthesized_inputs=bool(synthesized), synthesized=synthesized,
        reconstruction_seconds=round(build_s, 6), run_seconds=round(run_s, 6), device=device,
        dtype=req.dtype, backward=backward,
        backward_match=None if backward is None else all(b.allclose for b in backward), notes=notes,
    )
