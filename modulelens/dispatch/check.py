"""check-pack: replay each captured module with a pack applied, compare, and time with and without.

For each capture the pack's entries came from (and any named): the module is rebuilt from the
capture (replay strategy ``auto``), run once eager with the captured RNG state and once with the
pack applied (:func:`~modulelens.dispatch.api.apply_pack`) with the same RNG state; the pack's
outputs are compared with the captured outputs and with the eager replay (per-dtype tolerances
of :mod:`modulelens.numerics`); then both are timed in interleaved paired rounds by
:func:`modulelens.timing.measure_speedup` (the pack paused for the eager side): the speedup with its
95% interval, a number only when determined. A replay on which no pack kernel ran is not timed
(nothing to gain). Module entries are matched with the module's path in its model (the capture's
module path).
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import BaseModel, Field

from modulelens.dispatch.runtime import DEFAULT_MECHANISM, EntryReport, Mechanism, PackRuntime
from modulelens.dispatch.sources import CaptureReplay
from modulelens.repo import Repository


class CaptureCheck(BaseModel):
    capture: str
    strategy: str
    matches_captured: bool = Field(description="Outputs with the pack agree with the captured outputs.")
    matches_eager: bool = Field(description="Outputs with the pack agree with an eager replay (same RNG state).")
    max_abs_error: float = Field(description="Largest difference to the captured outputs.")
    hits: int
    fallbacks: int
    entries: list[EntryReport]
    eager_median_s: float | None = None
    pack_median_s: float | None = None
    speedup: float | None = Field(None, description="Module replay time eager / with the pack (median of paired "
                                  "rounds); null when undetermined or when no pack kernel ran.")
    speedup_interval: list[float] | None = Field(None, description="95% interval [low, high] of the speedup.")
    timing_status: Literal["ok", "undetermined"] = "undetermined"
    timing_reason: str = ""
    detail: str = ""


def _tensors(value: Any) -> list[torch.Tensor]:
    from modulelens.capture.values import flatten

    return [t for t in flatten(value) if isinstance(t, torch.Tensor)]


def _agree(got: Any, want: Any) -> tuple[bool, float, str]:
    from modulelens.numerics import diff, tolerances

    g, w = _tensors(got), _tensors(want)
    if len(g) != len(w):
        return False, float("inf"), f"{len(g)} output tensors, {len(w)} expected"
    worst, ok, why = 0.0, True, ""
    for i, (a, b) in enumerate(zip(g, w)):
        rtol, atol = tolerances(b.dtype)
        d = diff(a, b, max(rtol, 1e-5), max(atol, 1e-5))
        worst = max(worst, d.max_abs_error)
        if not d.allclose:
            ok, why = False, why or f"output {i}: max abs error {d.max_abs_error:.3g}"
    return ok, worst, why


def check_capture(repo: Repository, ref: str, make_runtime: Any, min_run_time: float) -> CaptureCheck:
    """Replay capture ``ref`` with a fresh runtime from ``make_runtime()`` applied (see module doc)."""
    from modulelens.capture.tracer import set_rng_states
    from modulelens.dispatch.api import AppliedPack
    from modulelens.timing import CallableSide, TimingPlan, measure_speedup, thread_choice

    cap = CaptureReplay(repo, ref)
    device = cap.device if not cap.device.startswith("cuda") or torch.cuda.is_available() else "cpu"
    cap.loaded.device = device
    args, kwargs = cap.loaded.inputs()
    expected, _ = cap.loaded.expected_outputs()
    rng = cap.loaded.rng()

    def call(module: torch.nn.Module) -> Any:
        if rng:
            set_rng_states(rng)
        with torch.set_grad_enabled(cap.grad_enabled):
            return module(*args, **kwargs)

    def check(module: torch.nn.Module) -> CaptureCheck:
        eager = call(module)
        applied = AppliedPack(module, make_runtime(), root_path=cap.module_path)
        try:
            packed = call(module)
            report = applied.runtime.report()
            hits = sum(e.hits for e in report.entries)

            def paused() -> Any:
                with applied.runtime.pause():
                    return call(module)

            m = None
            if hits:
                plan = TimingPlan(min_seconds=min_run_time, budget_s=max(2.0, 4 * min_run_time))
                m = measure_speedup(CallableSide("eager (pack paused)", paused, device),
                                    CallableSide("with the pack", lambda: call(module), device), plan,
                                    thread_choice())
        finally:
            applied.remove()
        ok_cap, worst, why = _agree(packed, expected)
        ok_eager, _, why_eager = _agree(packed, eager)
        entries = [e for e in report.entries if e.hits or e.fallbacks]
        out = CaptureCheck(capture=cap.ref, strategy="", matches_captured=ok_cap, matches_eager=ok_eager,
                           max_abs_error=worst, hits=hits, fallbacks=sum(e.fallbacks for e in entries),
                           entries=entries, detail=why or why_eager,
                           timing_reason="no pack kernel ran on the replay: nothing to time")
        if m is not None:
            out.eager_median_s = m.base.median_s if m.base else None
            out.pack_median_s = m.candidate.median_s if m.candidate else None
            out.speedup, out.speedup_interval = m.speedup, m.interval
            out.timing_status, out.timing_reason = m.status, m.note("the module replay, eager vs with the pack")
        return out

    result, strategy, _, _ = cap.loaded.with_strategy("auto", False, lambda m: check(m.train(cap.training)))
    result.strategy = strategy
    return result


def pack_captures(runtime: PackRuntime) -> list[str]:
    """The captures the pack's entries came from, in entry order."""
    out: list[str] = []
    for e in runtime.pack.content.entries:
        if e.capture and e.capture not in out:
            out.append(e.capture)
    return out


def check_pack(repo: Repository, path: str, captures: list[str], *, allow_env_mismatch: bool = False,
               mechanism: Mechanism = DEFAULT_MECHANISM, min_run_time: float = 0.3) -> list[CaptureCheck]:
    from modulelens.dispatch.api import load_runtime

    def make_runtime() -> PackRuntime:
        return load_runtime(path, allow_env_mismatch=allow_env_mismatch, mechanism=mechanism)

    refs = captures or pack_captures(make_runtime())
    return [check_capture(repo, ref, make_runtime, min_run_time) for ref in refs]
