"""check-pack: replay each captured module with a pack applied, compare, and time with and without.

For each capture the pack's entries came from (and any named): the module is rebuilt from the
capture (replay strategy ``auto``), run once eager with the captured RNG state and once with the
pack applied (:func:`~modulelens.dispatch.api.apply_pack`) with the same RNG state; the pack's
outputs are compared with the captured outputs and with the eager replay (per-dtype tolerances
of :mod:`modulelens.numerics`). When the capture holds gradients, both runs also go backward with
the captured output gradients, and the pack's input and parameter gradients are compared with
eager's (so backward entries are exercised). Then the forward is timed in interleaved paired
rounds by :func:`modulelens.timing.measure_speedup` (the pack paused for the eager side): the
speedup with its 95% interval, a number only when determined. A replay on which no pack kernel ran
is not timed (nothing to gain). Every run starts from the inputs as captured (rebuilt, untimed,
when the captured call changed them, as a key/value cache grows). Module entries are matched with
the module's path in its model (the capture's module path).

The pack is ok only when every replay matched and every entry that could be tested was hit
(:func:`entry_coverage`): a dispatched entry from a checked capture, a backward entry only where
the capture has gradients, an operator entry only where no module entry served the replay.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import torch
from pydantic import BaseModel, Field

from modulelens.capture import tensors_in
from modulelens.device import require
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
    backward: bool = Field(False, description="Also ran backward with the captured output gradients.")
    grads_match: bool | None = Field(None, description="With backward: the pack's gradients agree with eager's.")
    detail: str = ""


def _agree(got: Any, want: Any) -> tuple[bool, float, str]:
    from modulelens.numerics import diff, tolerances

    g, w = tensors_in(got), tensors_in(want)
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
    from modulelens.capture import set_rng_states
    from modulelens.dispatch.api import AppliedPack
    from modulelens.timing import CallableSide, TimingPlan, measure_speedup, thread_choice

    cap = CaptureReplay(repo, ref)
    device = require(cap.device, can_choose=False)
    cap.loaded.device = device
    inputs = [cap.loaded.inputs()]
    expected, _ = cap.loaded.expected_outputs()
    rng = cap.loaded.rng()

    grad_outputs = cap.grad_outputs()

    def rebuild() -> None:
        """The inputs as captured again: the last call may have changed them (a cache it grew)."""
        inputs[0] = cap.loaded.inputs()

    def call(module: torch.nn.Module) -> Any:
        args, kwargs = inputs[0]
        if rng:
            set_rng_states(rng)
        with torch.set_grad_enabled(cap.grad_enabled):
            return module(*args, **kwargs)

    def forward_backward(module: torch.nn.Module) -> tuple[Any, list[torch.Tensor]]:
        """Outputs, and with captured output gradients the input and parameter gradients, of a
        call on the inputs as captured."""
        rebuild()
        if not grad_outputs:
            return call(module), []
        args, kwargs = inputs[0]
        own = [a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a for a in args]
        module.zero_grad(set_to_none=True)
        if rng:
            set_rng_states(rng)
        with torch.set_grad_enabled(True):
            out = module(*own, **kwargs)
        pairs = [(o, g.to(o.device, o.dtype)) for o, g in zip(tensors_in(out), grad_outputs) if g is not None
                 and o.requires_grad]
        if pairs:
            torch.autograd.backward([p[0] for p in pairs], [p[1] for p in pairs])
        grads = [a.grad for a in own if isinstance(a, torch.Tensor) and a.grad is not None]
        grads += [p.grad for p in module.parameters() if p.grad is not None]
        return out, [g.detach().clone() for g in grads]

    def check(module: torch.nn.Module) -> CaptureCheck:
        eager, eager_grads = forward_backward(module)
        applied = AppliedPack(module, make_runtime(), root_path=cap.module_path)
        try:
            packed, packed_grads = forward_backward(module)
            report = applied.runtime.report()
            hits = sum(e.hits for e in report.entries)

            def paused() -> Any:
                with applied.runtime.pause():
                    return call(module)

            m = None
            if hits:
                plan = TimingPlan(min_seconds=min_run_time, budget_s=max(2.0, 4 * min_run_time))
                setup = rebuild if cap.loaded.changed_inputs else None
                m = measure_speedup(CallableSide("eager (pack paused)", paused, device, setup=setup),
                                    CallableSide("with the pack", lambda: call(module), device, setup=setup), plan,
                                    thread_choice())
        finally:
            applied.remove()
        ok_cap, worst, why = _agree(packed, expected)
        ok_eager, _, why_eager = _agree(packed, eager)
        grads_ok, _, why_grads = _agree(packed_grads, eager_grads) if grad_outputs else (None, 0.0, "")
        entries = [e for e in report.entries if e.hits or e.fallbacks]
        out = CaptureCheck(capture=cap.ref, strategy="", matches_captured=ok_cap, matches_eager=ok_eager,
                           max_abs_error=worst, hits=hits, fallbacks=sum(e.fallbacks for e in entries),
                           entries=entries, backward=bool(grad_outputs), grads_match=grads_ok,
                           detail=why or why_eager or (f"gradients: {why_grads}" if why_grads else ""),
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
               mechanism: Mechanism = DEFAULT_MECHANISM, min_run_time: float = 0.3,
               progress: Callable[[str], None] | None = None,
               on_capture: Callable[[int, int, str], None] | None = None) -> tuple[list[CaptureCheck], PackRuntime]:
    """The check of each capture (see the module docstring), and a runtime of the pack (unused:
    for its entries and the entries it skips). Extensions of module entries with no verified build
    here are built first, in their own process, saying so through ``progress``
    (:func:`~modulelens.dispatch.builds.prepare_builds`); ``on_capture(i, n, ref)`` hears of each
    capture before its replay (the i-th of n, from 0)."""
    from modulelens.dispatch.api import load_runtime
    from modulelens.dispatch.builds import prepare_builds

    prepare_builds(path, progress or _stderr)

    def make_runtime() -> PackRuntime:
        return load_runtime(path, allow_env_mismatch=allow_env_mismatch, mechanism=mechanism)

    runtime = make_runtime()
    refs = captures or pack_captures(runtime)
    checks = []
    for i, ref in enumerate(refs):
        if on_capture is not None:
            on_capture(i, len(refs), ref)
        checks.append(check_capture(repo, ref, make_runtime, min_run_time))
    return checks, runtime


def _stderr(message: str) -> None:
    import sys

    print(f"modulelens: {message}", file=sys.stderr, flush=True)


def entry_coverage(runtime: PackRuntime, checks: list[CaptureCheck]) -> tuple[list[str], list[str]]:
    """(entries that could be tested but were never hit, with why; entries that could not be
    tested, with why). An entry can be tested when it is dispatched and its capture was checked
    (a backward entry: with gradients)."""
    by_capture = {c.capture: c for c in checks}
    entries = runtime.pack.content.entries
    # a module entry that served a capture's replay runs instead of the operator entries inside it
    covering = {e.capture: e.candidate_id for i, e in enumerate(entries) if e.kind == "module"
                and i not in runtime.skipped and e.capture in by_capture
                and any(x.candidate_id == e.candidate_id and x.hits for x in by_capture[e.capture].entries)}
    not_hit, untested = [], []
    for i, entry in enumerate(entries):
        cid = entry.candidate_id
        if i in runtime.skipped:
            untested.append(f"{cid}: not dispatched ({runtime.skipped[i]})")
            continue
        check = by_capture.get(entry.capture or "")
        if entry.kind == "op" and entry.capture in covering:
            untested.append(f"{cid}: inside {covering[entry.capture]}, which served the replay of {entry.capture} "
                            "(a module entry and the operator entries inside it never both fire)")
        elif check is None:
            untested.append(f"{cid}: its capture {entry.capture or '(none)'} was not checked")
        elif entry.phase == "backward" and not check.backward:
            untested.append(f"{cid}: a backward entry, and {check.capture} has no gradients to run backward with")
        else:
            seen = next((e for e in check.entries if e.candidate_id == cid), None)
            if seen is None or seen.hits == 0:
                why = next(iter(seen.fallback_reasons), "") if seen else ""
                not_hit.append(f"{cid}: not hit by the replay of {check.capture}" + (f" ({why})" if why else ""))
    return not_hit, untested
