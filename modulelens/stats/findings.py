"""Findings: rules over the stored series that point at a module and say what to do.

Each finding is a :class:`~modulelens.stats.schema.StatsFinding`. The rules (thresholds in
:data:`DEFAULT_THRESHOLDS`, all overridable):

- ``nan_inf``: where NaN/Inf was born. With a rerun's answer (``series.nan_origin``, see
  :mod:`modulelens.stats.sentinel`): its module, step, phase (forward, backward, optimizer) and
  tensor (input, output, weight, gradient). Otherwise, from the sampled steps: the first module,
  in the order calls finished, whose output holds NaN/Inf while its inputs did not (children finish
  before their parents, so this is the innermost module where they appear), at the first sampled
  step where any appear.
- ``nan_inf_gradient``: gradients turn NaN/Inf while the forward pass was finite: the first module,
  in the order gradients arrived, whose output gradient holds NaN/Inf.
- activation, saturation and gradient rules: see :mod:`modulelens.stats.rules`.
- parameter rules (``no_gradient`` over the whole run; ``exploding_parameter_gradient`` and
  ``exploding_update`` on each step): see :mod:`modulelens.stats.param_rules`.

Activation, saturation and gradient rules judge every sampled step before the first one where any
NaN/Inf appeared (a module that did not run on a step is not judged on it); each finding says on how
many sampled steps it held and the first and last of them. Where a module is nested in another with
the same finding, the innermost one is reported. The action of a finding follows from the evidence
across modules and steps (:mod:`modulelens.stats.advice`), which it names in ``based_on``. A healthy
model gives no finding.
"""

from __future__ import annotations

from modulelens.stats.advice import advise
from modulelens.stats.judging import DEFAULT_THRESHOLDS, finding, fmt, label
from modulelens.stats.param_rules import gradient_flow
from modulelens.stats.rules import gated_by_zero_init_scales, step_findings
from modulelens.stats.schema import Phase, RunSeries, StatsFinding, TensorRole, cell

__all__ = ["DEFAULT_THRESHOLDS", "evaluate"]

def evaluate(series: RunSeries, thresholds: dict[str, float] | None = None) -> list[StatsFinding]:
    """All findings of a run: NaN/Inf first, then every other rule judged on every sampled step
    before the first one with NaN/Inf. A finding that held on several steps is reported once, with
    the numbers of the last step where it held (``step``) and ``first_step``, ``last_step`` and
    ``steps_held``; findings are ordered by the step where they first held. Their actions then
    follow the evidence across modules and steps (:func:`modulelens.stats.advice.advise`)."""
    th = {**DEFAULT_THRESHOLDS, **(thresholds or {})}
    steps = series.steps
    if not steps:
        return []
    nonfinite: list[StatsFinding] = []
    first_bad = nonfinite_findings(series, nonfinite)
    judged = steps.index(first_bad) if first_bad in steps else len(steps)
    held: dict[tuple[str, str], list[StatsFinding]] = {}
    findings: list[StatsFinding] = []
    gated = gated_by_zero_init_scales(series)
    for i in range(judged):
        for f in step_findings(series, i, steps[i], th, gated):
            held.setdefault((f.kind, f.module), []).append(f)
    for occurrences in held.values():
        findings.append(occurrences[-1].model_copy(update={
            "first_step": occurrences[0].step, "last_step": occurrences[-1].step, "steps_held": len(occurrences)}))
    findings += gradient_flow(series, judged, _explained_zero_gradients(findings))
    findings.sort(key=lambda f: f.first_step if f.first_step is not None else f.step)
    return [advise(series, f, th) for f in [*nonfinite, *findings]]


def _explained_zero_gradients(findings: list[StatsFinding]) -> set[str]:
    """Modules whose weights get a zero gradient because of another finding: a dead activation or a
    zero multiplier, and the weights feeding them."""
    out: set[str] = set()
    for f in findings:
        if f.kind in ("dead_activation", "zero_scale"):
            out.add(f.module)
            if isinstance(f.evidence.get("weights"), str):
                out.add(f.evidence["weights"])
    return out


# -- NaN / Inf -------------------------------------------------------------------------------

_ORIGIN_ACTIONS: dict[tuple[Phase, TensorRole], str] = {
    ("forward", "input"): "check the batch (torch.isfinite on the inputs), the data pipeline and any preprocessing done "
    "outside nn.Module calls",
    ("forward", "output"): "look at the operations inside {m}'s forward: log/sqrt of non-positive values, division by "
    "zero, exp overflow, or a float16 overflow; clamp or add an epsilon there",
    ("forward", "weight"): "its weights held NaN/Inf before this step's forward, and no optimizer step wrote them: look "
    "for code that writes weights directly (a checkpoint load, an in-place edit under torch.no_grad)",
    ("backward", "gradient"): "look at the backward of {m}: ops whose derivative is infinite at the values it sees "
    "(sqrt or pow at 0, norm of a zero vector, log near 0, a custom autograd Function); clamp their inputs, add an "
    "epsilon, or use a GradScaler with float16",
    ("optimizer", "weight"): "optimizer.step() turned finite gradients into NaN/Inf weights: check the learning rate "
    "(inf, or a schedule that blows up), the optimizer's epsilon (0 divides by zero with Adam) and the weight decay",
}


def nonfinite_findings(series: RunSeries, findings: list[StatsFinding]) -> int | None:
    """Append the NaN/Inf finding (if any) and return the first sampled step that held NaN/Inf."""
    events = series.nonfinite
    if not events:
        return None
    ev = events[0]
    step = ev.step
    held = {"first_step": step, "last_step": events[-1].step, "steps_held": len(events)}
    origin = series.nan_origin
    if origin is not None and origin.found and origin.step is not None and origin.phase and origin.tensor:
        findings.append(_origin_finding(series, step, held))
        return step
    f = _sampled_nan_finding(series, step)
    if f is not None:
        if origin is not None and not origin.found:
            f = f.model_copy(update={"message": f"{f.message} A rerun to find where they are born did not: {origin.detail}"})
        findings.append(f.model_copy(update=held))
    return step


def _origin_finding(series: RunSeries, first_seen: int, held: dict[str, int]) -> StatsFinding:
    o = series.nan_origin
    assert o is not None and o.step is not None and o.phase is not None and o.tensor is not None
    module = o.module or ""
    where = f"in the {o.phase} pass" if o.phase != "optimizer" else "in optimizer.step()"
    seen = f" ({o.seen_in})" if o.seen_in else ""
    sampled = (f"; the sampled steps first saw them at step {first_seen}" if first_seen != o.step else "")
    message = (f"NaN/Inf is born at step {o.step} {where}, in {label(module)}{seen}. {o.detail} Found by rerunning the "
               f"script with a NaN/Inf check on every output, gradient and weight of every step up to step "
               f"{first_seen}{sampled}.").replace("  ", " ")
    action = _ORIGIN_ACTIONS.get((o.phase, o.tensor), "look at what {m} computes at that step").format(m=label(module))
    evidence = {"step": o.step, "first_seen_step": first_seen, "steps_checked": o.steps_checked,
                "rerun_seconds": round(o.seconds, 1)}
    if o.parameter:
        evidence["parameter"] = o.parameter
    return finding("nan_inf", module, o.step, "error", message, action, evidence, found_by="rerun", phase=o.phase,
                   tensor=o.tensor, **held)


def _sampled_nan_finding(series: RunSeries, step: int) -> StatsFinding | None:
    ev = series.nonfinite[0]
    i = series.steps.index(step)
    bad_params = [p for p, c in series.params.items() if cell(c.nonfinite_weight, i)]
    prev = series.steps[i - 1] if i > 0 else None
    since = f"between step {prev} (finite) and step {step}" if prev is not None else f"at step {step}"
    if ev.calls:
        origin = next((c for c in ev.calls if not c.input_nonfinite), None)
        if origin is None:
            first = ev.calls[0].module
            return finding(
                "nan_inf", first, step, "error",
                f"NaN/Inf values are already in the inputs of {label(first)} at step {step}: they come from the "
                "data or from code outside the model's modules, not from a module.",
                _ORIGIN_ACTIONS[("forward", "input")], {"step": step}, phase="forward", tensor="input")
        name = origin.module
        nan, inf = series.at(name, "activation", "nan", i), series.at(name, "activation", "inf", i)
        own_bad = [p for p in bad_params if series.params[p].module == name]
        msg = (f"NaN/Inf first appears in the output of {label(name)} at step {step} ({fmt(nan)} NaN, {fmt(inf)} Inf "
               f"values) while its inputs were finite; every module after it inherits them.")
        tensor: TensorRole = "output"
        if own_bad:
            msg += f" Its parameter {own_bad[0]} holds NaN/Inf."
            tensor = "weight"
            action = (f"find what wrote NaN/Inf into {own_bad[0]} (a bad update: lower the learning rate, clip "
                      "gradients, check the loss for log(0) or division by zero; or a corrupted checkpoint)")
        else:
            action = _ORIGIN_ACTIONS[("forward", "output")].format(m=label(name))
        spread = len(bad_params) > 1 and len(bad_params) > len(own_bad)
        if spread:
            msg += (f" The weights of {len(bad_params)} parameters are already NaN/Inf, so an earlier optimizer step "
                    f"spread them: the fault happened {since}, and the module named is only where they show first.")
            action += (f"; to find where they are born, run the script with `modulelens gather-stats` (it reruns it "
                       f"with a NaN/Inf check on every step) or sample every step (every=1, --steps {step + 1})")
        return finding("nan_inf", name, step, "error", msg, action, {
            "step": step, "nan": nan, "inf": inf, "nonfinite_parameters": len(bad_params),
        }, phase=None if spread else "forward", tensor=None if spread else tensor)
    if ev.grads:
        name = ev.grads[0]
        return finding(
            "nan_inf_gradient", name, step, "error",
            f"The forward pass was finite at step {step}, but the gradient arriving at the output of {label(name)} "
            "holds NaN/Inf: the backward pass of the loss or of a module after it produced them.",
            "check the loss (log of 0, division by zero) and backward-unsafe ops after this module (sqrt at 0, "
            "norm of a zero vector); clip gradients or use a GradScaler for float16",
            {"step": step, "nan": series.at(name, "gradient", "nan", i), "inf": series.at(name, "gradient", "inf", i)},
            phase="backward", tensor="gradient")
    return None
