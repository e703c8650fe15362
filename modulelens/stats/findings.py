"""Findings: rules over the stored series that point at a module and say what to do.

Each finding is a dict ``{kind, module, step, severity, message, action, evidence}``. The rules
(thresholds in :data:`DEFAULT_THRESHOLDS`, all overridable):

- ``nan_inf``: the first module, in the order calls finished, whose output holds NaN/Inf while its
  inputs did not (children finish before their parents, so this is the innermost module where the
  non-finite values appear), at the first sampled step where any appear.
- ``nan_inf_gradient``: gradients turn NaN/Inf while the forward pass was finite: the first module,
  in the order gradients arrived, whose output gradient holds NaN/Inf.
- ``dead_activation``: a ReLU-like module (or any module with a non-negative output) whose output is
  exactly zero for at least ``dead_zero_frac`` of the elements while its input was not all zero.
- ``exploding_activation``: a module whose output rms is at least ``explode_gain`` times its input
  rms and at least ``explode_rms``; or the first module whose output rms reaches
  ``explode_abs_rms`` and ``explode_gain`` times the model's input rms (large raw inputs are not
  growth).
- ``vanishing_activation``: a module whose output rms is at most ``vanish_gain`` times its input rms,
  or the first module whose output rms falls below ``vanish_abs_rms`` times the model's input rms;
  either way the output rms must also be at most ``vanish_rms`` in absolute terms and not exactly
  zero (a normalisation layer that brings raw-scale inputs to rms 1 shrinks them a lot, but its
  output is not "nearly zero").
- ``exploding_gradient`` / ``vanishing_gradient``: over the leaf modules, the gradient rms at a
  module's output compared with the median over the *healthy* leaves: those within the two ratios
  below of the loss end (the median of the last three leaves in execution order). Gradient problems
  compound going backward from the loss, so a vanished or exploded upstream part cannot drag this
  reference (the median over all leaves can: with half the net vanished it sits in the vanished
  half and makes the healthy layers near the loss look exploding, and the advice, clipping, would
  be wrong). ``explode_grad_ratio`` times above (at least two modules), or
  ``vanish_grad_ratio`` times below. The module named is where the change happens going backward.
- ``saturation``: a tanh/sigmoid/hardtanh module with at least ``saturation_frac`` of its outputs
  within 1% of a bound.

Activation, saturation and gradient rules judge every sampled step before the first one where any
NaN/Inf appeared (a module that did not run on a step is not judged on it); each finding says on how
many sampled steps it held and the first and last of them. Where a module is nested in another with
the same finding, the innermost one is reported. A healthy model gives no finding.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

DEFAULT_THRESHOLDS: dict[str, float] = {
    "dead_zero_frac": 0.95,
    "explode_gain": 30.0,
    "explode_rms": 30.0,
    "explode_abs_rms": 1e4,
    "vanish_gain": 1e-3,
    "vanish_abs_rms": 1e-4,
    "vanish_rms": 1e-2,
    "explode_grad_ratio": 300.0,
    "vanish_grad_ratio": 1e-3,
    "saturation_frac": 0.5,
}

LOSS_END = 3  # leaves nearest the loss whose median gradient rms is the gradient rules' reference
RELU_LIKE = {"ReLU", "ReLU6", "Threshold", "RReLU"}


def _finding(kind: str, module: str, step: int, severity: str, message: str, action: str,
             evidence: dict[str, Any]) -> dict[str, Any]:
    return {
        "kind": kind, "module": module, "step": step, "severity": severity, "message": message,
        "action": action, "evidence": {k: _num(v) for k, v in evidence.items()},
    }


def _num(v: Any) -> Any:
    if isinstance(v, float):
        return float(f"{v:.4g}") if math.isfinite(v) else None
    return v


def _fmt(x: Any) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, float):
        return f"{x:.3g}"
    return str(x)


def _label(name: str) -> str:
    return name if name else "the model (root)"


def _at(series: dict[str, Any], name: str, kind: str, stat: str, i: int) -> Any:
    col = series["modules"].get(name, {}).get(kind, {}).get(stat)
    if not col or i >= len(col):
        return None
    return col[i]


def _innermost(names: list[str]) -> list[str]:
    """Drop any name that has a descendant in the list (keep the innermost module)."""
    keep = []
    for n in names:
        prefix = n + "." if n else ""
        if not any(o != n and (n == "" or o.startswith(prefix)) for o in names):
            keep.append(n)
    return keep


def _leaves(series: dict[str, Any]) -> list[str]:
    order = series["order"]
    return [n for n in order if not any(o != n and (n == "" or o.startswith(n + ".")) for o in order)]


def _descendants_or_self(name: str, names: list[str]) -> list[str]:
    return [o for o in names if o == name or name == "" or o.startswith(name + ".")]


def evaluate(series: dict[str, Any], thresholds: dict[str, float] | None = None) -> list[dict[str, Any]]:
    """All findings of a run: NaN/Inf first (at the first sampled step where any appear), then every
    other rule judged on every sampled step before that one. A finding that held on several steps is
    reported once, with the numbers of the last step where it held (``step``) and ``first_step``,
    ``last_step`` and ``steps_held``; findings are ordered by the step where they first held."""
    th = {**DEFAULT_THRESHOLDS, **(thresholds or {})}
    steps = series["steps"]
    if not steps:
        return []
    findings: list[dict[str, Any]] = []
    first_bad = _nan_findings(series, findings)
    judged = steps.index(first_bad) if first_bad is not None else len(steps)
    held: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for i in range(judged):
        for f in _step_findings(series, i, steps[i], th):
            held.setdefault((f["kind"], f["module"]), []).append(f)
    for occurrences in held.values():
        findings.append({**occurrences[-1], **_held(occurrences[0]["step"], occurrences[-1]["step"], len(occurrences))})
    return findings


def _held(first: int, last: int, count: int) -> dict[str, int]:
    return {"first_step": first, "last_step": last, "steps_held": count}


def _step_findings(series: dict[str, Any], i: int, step: int, th: dict[str, float]) -> list[dict[str, Any]]:
    """The activation, saturation and gradient rules at sampled step index ``i``."""
    dead = _dead(series, i, step, th)
    dead_names = {f["module"] for f in dead}
    # A dead module also shrinks its input: the dead finding says why.
    scale = [f for f in _activation_scale(series, i, step, th)
             if not (f["kind"] == "vanishing_activation" and f["module"] in dead_names)]
    return [*dead, *scale, *_saturation(series, i, step, th), *_gradients(series, i, step, th, dead)]


# -- NaN / Inf -------------------------------------------------------------------------------


def _nan_findings(series: dict[str, Any], findings: list[dict[str, Any]]) -> int | None:
    events = series.get("nonfinite") or []
    if not events:
        return None
    ev = events[0]
    step = ev["step"]
    held = _held(step, events[-1]["step"], len(events))
    i = series["steps"].index(step)
    bad_params = [
        p for p, info in series.get("params", {}).items()
        if i < len(info.get("nonfinite_weight") or []) and info["nonfinite_weight"][i]
    ]
    prev = series["steps"][i - 1] if i > 0 else None
    since = (f"between step {prev} (finite) and step {step}" if prev is not None else f"at step {step}")
    if ev["calls"]:
        origin = next((c for c in ev["calls"] if not c["input_nonfinite"]), None)
        if origin is None:
            first = ev["calls"][0]["module"]
            findings.append({**_finding(
                "nan_inf", first, step, "error",
                f"NaN/Inf values are already in the inputs of {_label(first)} at step {step}: they come from the "
                "data or from code outside the model's modules, not from a module.",
                "check the batch (torch.isfinite on the inputs), the data pipeline and any preprocessing done "
                "outside nn.Module calls",
                {"step": step},
            ), **held})
            return step
        name = origin["module"]
        nan = _at(series, name, "activation", "nan", i)
        inf = _at(series, name, "activation", "inf", i)
        own_bad = [p for p in bad_params if series["params"][p]["module"] == name]
        msg = (f"NaN/Inf first appears in the output of {_label(name)} at step {step} ({_fmt(nan)} NaN, {_fmt(inf)} Inf "
               f"values) while its inputs were finite; every module after it inherits them.")
        if own_bad:
            msg += f" Its parameter {own_bad[0]} holds NaN/Inf."
            action = (f"find what wrote NaN/Inf into {own_bad[0]} (a bad update: lower the learning rate, clip "
                      "gradients, check the loss for log(0) or division by zero; or a corrupted checkpoint)")
        else:
            action = (f"look at the operations inside {_label(name)}'s forward: log/sqrt of non-positive values, "
                      "division by zero, exp overflow, or a float16 overflow; clamp or add an epsilon there")
        if len(bad_params) > 1 and len(bad_params) > len(own_bad):
            msg += (f" The weights of {len(bad_params)} parameters are already NaN/Inf, so an earlier optimizer step "
                    f"spread them: the fault happened {since}.")
            action += f"; re-run with --every 1 --steps {step + 1} to catch the first step where it happens"
        findings.append({**_finding("nan_inf", name, step, "error", msg, action, {
            "step": step, "nan": nan, "inf": inf, "nonfinite_parameters": len(bad_params),
        }), **held})
        return step
    if ev["grads"]:
        name = ev["grads"][0]
        findings.append({**held, **_finding(
            "nan_inf_gradient", name, step, "error",
            f"The forward pass was finite at step {step}, but the gradient arriving at the output of {_label(name)} "
            "holds NaN/Inf: the backward pass of the loss or of a module after it produced them.",
            "check the loss (log of 0, division by zero) and backward-unsafe ops after this module (sqrt at 0, "
            "norm of a zero vector); clip gradients or use a GradScaler for float16",
            {"step": step, "nan": _at(series, name, "gradient", "nan", i), "inf": _at(series, name, "gradient", "inf", i)},
        )})
        return step
    return None


# -- activations -----------------------------------------------------------------------------


def _dead(series: dict[str, Any], i: int, step: int, th: dict[str, float]) -> list[dict[str, Any]]:
    cands = []
    for name in series["order"]:
        info = series["modules"][name]
        zf = _at(series, name, "activation", "zero_frac", i)
        mn = _at(series, name, "activation", "min", i)
        if zf is None or zf < th["dead_zero_frac"]:
            continue
        if _at(series, name, "activation", "input_rms", i) == 0:
            continue  # its input is already all zero: a consequence of a dead module before it
        if info["type"] in RELU_LIKE or (mn is not None and mn >= 0):
            cands.append(name)
    out = []
    order = series["order"]
    for name in _downstream_of_a_cut(series, i, _innermost(cands), th):
        pos = order.index(name)
        before = next((o for o in reversed(order[:pos]) if not name.startswith(o + ".") and o and not o.startswith(name + ".")
                       and _at(series, o, "activation", "rms", i) is not None), None)
        zf = _at(series, name, "activation", "zero_frac", i)
        evidence = {"zero_frac": zf, "input_rms": _at(series, name, "activation", "input_rms", i)}
        detail = ""
        if before is not None:
            pm, pmax = _at(series, before, "activation", "mean", i), _at(series, before, "activation", "max", i)
            evidence.update({"previous_module": before, "previous_mean": pm, "previous_max": pmax})
            if pmax is not None and pmax <= 0:
                detail = f" Its input from {before} is negative everywhere (mean {_fmt(pm)}, max {_fmt(pmax)})."
            else:
                detail = f" The module before it, {before}, outputs mean {_fmt(pm)}, max {_fmt(pmax)}."
        out.append(_finding(
            "dead_activation", name, step, "error",
            f"{_label(name)} outputs exactly zero for {zf:.1%} of its values at step {step}: its units are dead "
            f"(the pre-activation is negative almost everywhere), so no gradient flows back through it and the "
            f"layers before it stop learning.{detail}",
            "check the bias and initialisation of the layer feeding it (a large negative bias, or weights that push "
            "pre-activations negative), lower the learning rate, or use LeakyReLU/GELU or a normalisation layer before it",
            evidence,
        ))
    return out


def _downstream_of_a_cut(series: dict[str, Any], i: int, dead: list[str], th: dict[str, float]) -> list[str]:
    """``dead`` without the modules that are dead only because an earlier dead module cut the
    signal: their input rms is at most ``vanish_gain`` times that dead module's input rms."""
    order = series["order"]
    keep: list[str] = []
    for name in dead:
        rms_in = _at(series, name, "activation", "input_rms", i)
        cut = rms_in is not None and any(
            order.index(d) < order.index(name) and rms_in <= th["vanish_gain"] * (_at(series, d, "activation", "input_rms", i) or 0)
            for d in keep
        )
        if not cut:
            keep.append(name)
    return keep


def _activation_scale(series: dict[str, Any], i: int, step: int, th: dict[str, float]) -> list[dict[str, Any]]:
    order = series["order"]
    explode, vanish = [], []
    for name in order:
        gain = _at(series, name, "activation", "gain", i)
        rms = _at(series, name, "activation", "rms", i)
        if gain is None or rms is None:
            continue
        if gain >= th["explode_gain"] and rms >= th["explode_rms"]:
            explode.append(name)
        elif 0 < rms <= th["vanish_rms"] and gain <= th["vanish_gain"]:
            vanish.append(name)
    out = []
    for name in _innermost(explode):
        gain = _at(series, name, "activation", "gain", i)
        rms = _at(series, name, "activation", "rms", i)
        in_rms = _at(series, name, "activation", "input_rms", i)
        after = [o for o in order[order.index(name) + 1:] if (_at(series, o, "activation", "rms", i) or 0) >= th["explode_rms"]]
        out.append(_finding(
            "exploding_activation", name, step, "error",
            f"{_label(name)} multiplies the scale of its input by {gain:.3g}x at step {step} (input rms {_fmt(in_rms)}, "
            f"output rms {_fmt(rms)}, max |x| {_fmt(max(abs(_at(series, name, 'activation', 'min', i) or 0), abs(_at(series, name, 'activation', 'max', i) or 0)))}); "
            f"{len(after)} module(s) after it carry the blown-up values.",
            f"check the initialisation scale of {_label(name)}'s weights (e.g. std far above 1/sqrt(fan_in)) and any "
            "scaling factor in its forward; re-initialise it (nn.init.kaiming_uniform_/xavier) or add a normalisation layer",
            {"gain": gain, "input_rms": in_rms, "output_rms": rms, "modules_after": len(after)},
        ))
    model_in = _model_input_rms(series, i)
    if not explode:
        floor = max(th["explode_abs_rms"], th["explode_gain"] * (model_in or 0.0))
        first = next((n for n in order if (_at(series, n, "activation", "rms", i) or 0) >= floor), None)
        if first is not None:
            rms = _at(series, first, "activation", "rms", i)
            out.append(_finding(
                "exploding_activation", first, step, "error",
                f"Activations grow layer by layer and reach rms {_fmt(rms)} at {_label(first)} at step {step}; "
                "no single module is to blame: the growth accumulates with depth.",
                "use a smaller initialisation scale, residual scaling or normalisation layers (LayerNorm/BatchNorm)",
                {"output_rms": rms},
            ))
    for name in _innermost(vanish):
        gain = _at(series, name, "activation", "gain", i)
        out.append(_finding(
            "vanishing_activation", name, step, "warning",
            f"{_label(name)} shrinks the scale of its input by {1 / gain:.3g}x at step {step} (input rms "
            f"{_fmt(_at(series, name, 'activation', 'input_rms', i))}, output rms {_fmt(_at(series, name, 'activation', 'rms', i))}): "
            "the signal after it is nearly zero.",
            f"check the initialisation scale of {_label(name)} (weights far below 1/sqrt(fan_in)) and any scaling in its "
            "forward; if it is initialised to zero on purpose (LoRA, zero-init residual), ignore this",
            {"gain": gain},
        ))
    if not vanish:
        ref = model_in
        if ref:
            limit = min(th["vanish_abs_rms"] * ref, th["vanish_rms"])
            first = next((n for n in order if 0 < (_at(series, n, "activation", "rms", i) or ref) < limit), None)
            if first is not None:
                rms = _at(series, first, "activation", "rms", i)
                out.append(_finding(
                    "vanishing_activation", first, step, "warning",
                    f"Activations shrink layer by layer to rms {_fmt(rms)} at {_label(first)} (the model's input rms is "
                    f"{_fmt(ref)}) at step {step}: the signal fades with depth.",
                    "use an initialisation that preserves scale (kaiming for ReLU, xavier for tanh), residual connections "
                    "or normalisation layers",
                    {"output_rms": rms, "model_input_rms": ref},
                ))
    return out


def _model_input_rms(series: dict[str, Any], i: int) -> float | None:
    """The input rms of the first module in execution order (the root) at step index ``i``."""
    order = series["order"]
    return _at(series, order[0], "activation", "input_rms", i) if order else None


def _saturation(series: dict[str, Any], i: int, step: int, th: dict[str, float]) -> list[dict[str, Any]]:
    out = []
    for name in series["order"]:
        sf = _at(series, name, "activation", "sat_frac", i)
        if sf is None or sf < th["saturation_frac"]:
            continue
        out.append(_finding(
            "saturation", name, step, "warning",
            f"{sf:.1%} of the outputs of {_label(name)} ({series['modules'][name]['type']}) sit at the ends of its range "
            f"at step {step}: there its gradient is almost zero, so the layers before it learn slowly.",
            "scale down the pre-activations (smaller initialisation or learning rate), add a normalisation layer "
            "before it, or use an activation that does not saturate",
            {"sat_frac": sf, "input_rms": _at(series, name, "activation", "input_rms", i)},
        ))
    return out


# -- gradients -------------------------------------------------------------------------------


def _healthy_gradient_reference(grads: list[float], th: dict[str, float]) -> float:
    """The median gradient rms of the healthy leaves (``grads`` in execution order, all > 0): those
    within the rules' band around the loss end (the median of the last :data:`LOSS_END` leaves)."""
    end = statistics.median(grads[-LOSS_END:])
    healthy = [v for v in grads if th["vanish_grad_ratio"] * end < v < th["explode_grad_ratio"] * end]
    return statistics.median(healthy) if healthy else end


def _gradients(series: dict[str, Any], i: int, step: int, th: dict[str, float],
               dead: list[dict[str, Any]]) -> list[dict[str, Any]]:
    leaves = _leaves(series)
    g = {n: _at(series, n, "gradient", "rms", i) for n in leaves}
    g = {n: v for n, v in g.items() if v is not None}
    seq = [n for n in leaves if n in g]
    positive = [g[n] for n in seq if g[n] > 0]
    if len(positive) < 3:
        return []
    ref = _healthy_gradient_reference(positive, th)
    out = []
    big = [n for n in seq if g[n] >= th["explode_grad_ratio"] * ref]
    if len(big) >= 2:  # one outlier (e.g. a broadcast embedding's summed gradient) is not a trend
        last_big = big[-1]
        pos = seq.index(last_big)
        culprit = seq[pos + 1] if pos + 1 < len(seq) else last_big
        out.append(_finding(
            "exploding_gradient", culprit, step, "error",
            f"Gradients grow as they flow backward through {_label(culprit)} at step {step}: the gradient at the output "
            f"of {last_big} has rms {_fmt(g[last_big])}, {g[last_big] / ref:.3g}x the median over healthy modules ({_fmt(ref)}); "
            f"{len(big)} module(s) before it get such gradients.",
            f"check the weight scale of {_label(culprit)}; clip gradients (torch.nn.utils.clip_grad_norm_), lower the "
            "learning rate, or add normalisation",
            {"gradient_rms": g[last_big], "median_gradient_rms": ref, "modules_affected": len(big)},
        ))
    dead_pos = [seq.index(d["module"]) for d in dead if d["module"] in seq]
    last_dead = max(dead_pos) if dead_pos else -1
    small = [n for k, n in enumerate(seq) if g[n] <= th["vanish_grad_ratio"] * ref and not (k < last_dead)]
    if small:
        last_small = small[-1]
        out.append(_finding(
            "vanishing_gradient", last_small, step, "warning",
            f"Gradients fade as they flow backward: at the output of {_label(last_small)} the gradient rms is "
            f"{_fmt(g[last_small])}, {g[last_small] / ref:.2g}x the median over healthy modules ({_fmt(ref)}) at step {step}; "
            f"{len(small)} module(s) get such small gradients and barely learn.",
            "look for saturating activations (sigmoid/tanh) or a too-small initialisation along the path; use ReLU/GELU, "
            "residual connections, normalisation layers or a scale-preserving initialisation",
            {"gradient_rms": g[last_small], "median_gradient_rms": ref, "modules_affected": len(small)},
        ))
    return out
