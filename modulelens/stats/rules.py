"""The rules judged on each sampled step (see :func:`modulelens.stats.findings.evaluate`):

- ``dead_activation``: a ReLU-like module (or any module with a non-negative output) whose output is
  exactly zero for at least ``dead_zero_frac`` of the elements while its input was not all zero,
  *and* whose units get no gradient: at least ``dead_unit_frac`` of the rows of the weight feeding
  it (its own, else that of the module before it in execution order) got an exactly zero gradient.
  A sparse layer whose units each fire for some inputs (a mixture-of-experts router) passes
  gradients to every unit and is not dead; a layer frozen by design (no gradient at all) is not
  judged. Without parameter statistics, the zero fraction alone decides (said in the finding). The
  stated cause follows the evidence: a layer whose own weights are exactly zero is a zero-initialised
  layer nothing moves, not negative pre-activations; the input's maximum is the module's own input
  when known (``input_max``).
- ``zero_scale``: a module that is not ReLU-like and has no weight of two or more dimensions, whose
  output is exactly zero everywhere while its input is not (its input holds positive values, or its
  own parameters are exactly zero): it multiplies by an exact zero (a scale or gate at 0), which is
  not a dead activation. A learnable scale at zero that gets a gradient or moves (ReZero, LayerScale,
  zero-init gates) is healthy: no finding, and neither it nor the branch it multiplies is judged
  vanishing; it is a finding when it stays at zero (frozen, or a zero gradient) or when the multiplier
  is not a trained parameter (a buffer or a constant).
- ``exploding_activation``: a module whose output rms is at least ``explode_gain`` times its input
  rms and at least ``explode_rms``; or the first module whose output rms reaches
  ``explode_abs_rms`` and ``explode_gain`` times the model's input rms (large raw inputs are not
  growth).
- ``vanishing_activation``: a module whose output rms is at most ``vanish_gain`` times its input rms,
  or the first module whose output rms falls below ``vanish_abs_rms`` times the model's input rms;
  either way the output rms must also be at most ``vanish_rms`` in absolute terms and not exactly
  zero (a normalisation layer that brings raw-scale inputs to rms 1 shrinks them a lot, but its
  output is not "nearly zero").
- ``saturation``: a tanh/sigmoid/hardtanh module with at least ``saturation_frac`` of its outputs
  within 1% of a bound.
- ``softmax_saturation``: a module whose softmax (or attention weights) is nearly one-hot: a mean
  largest probability of at least ``softmax_max_prob`` and a mean normalised entropy of at most
  ``softmax_entropy`` (1: uniform, 0: one-hot). A softmax at the model's output (in the root's own
  code, or in the last module in execution order) is a prediction, where confidence is the goal:
  it is not judged.
- ``exploding_gradient`` / ``vanishing_gradient``: over the leaf modules, the gradient rms at a
  module's output compared with the median over the *healthy* leaves: those within the two ratios
  below of the loss end (the median of the last three leaves in execution order). Gradient problems
  compound going backward from the loss, so a vanished or exploded upstream part cannot drag this
  reference (the median over all leaves can: with half the net vanished it sits in the vanished
  half and makes the healthy layers near the loss look exploding, and the advice, clipping, would
  be wrong). ``explode_grad_ratio`` times above (at least two modules), or
  ``vanish_grad_ratio`` times below. The module named is where the change happens going backward.
"""

from __future__ import annotations

import statistics

from modulelens.stats.advice import spike_at
from modulelens.stats.judging import finding, fmt, innermost, is_ancestor, label, leaves
from modulelens.stats.param_rules import (
    own_params,
    parameter_findings,
    scale_moves,
    zero_init_scale,
    zero_scale_params,
)
from modulelens.stats.schema import RunSeries, StatsFinding, cell

LOSS_END = 3  # leaves nearest the loss whose median gradient rms is the gradient rules' reference
RELU_LIKE = {"ReLU", "ReLU6", "Threshold", "RReLU"}
TABLES = {"Embedding", "EmbeddingBag"}


def step_findings(series: RunSeries, i: int, step: int, th: dict[str, float],
                  gated: set[str] | None = None) -> list[StatsFinding]:
    """The activation, saturation, gradient and parameter rules at sampled step index ``i``
    (``gated``: :func:`gated_by_zero_init_scales` of the series, worked out once per run)."""
    gated = gated_by_zero_init_scales(series) if gated is None else gated
    dead = _dead(series, i, step, th)
    dead_names = {f.module for f in dead}
    # A dead module also shrinks its input: the dead finding says why.
    scale = [f for f in _activation_scale(series, i, step, th, gated)
             if not (f.kind == "vanishing_activation" and f.module in dead_names)]
    gradients = _gradients(series, i, step, th, dead, gated)
    exploding = any(f.kind.startswith("exploding") for f in (*scale, *gradients))
    # Weights' gradients and updates blow up with the activations or gradients, or all at once (the
    # learning rate, a bad batch): those findings and their advice say where.
    params = [] if exploding else parameter_findings(series, i, step, th)
    if params and any(spike_at(series, i, c, th["spike_factor"]) for c in ("update_ratio", "grad_to_weight")):
        params = []
    return [*dead, *scale, *_saturation(series, i, step, th), *_softmax_saturation(series, i, step, th),
            *gradients, *params]


# -- dead units ------------------------------------------------------------------------------


def feeding_weights(series: RunSeries, name: str) -> tuple[str | None, list[str]]:
    """The module whose weights make ``name``'s input, and those weights (two or more dimensions):
    ``name``'s own, else those of the nearest module before it in execution order that is not one
    of its containers. (None, []) when no module before it has such weights."""
    def weights(module: str) -> list[str]:
        if series.modules.get(module) is not None and series.modules[module].type in TABLES:
            return []  # an embedding's rows are table entries, not units
        return [p for p, c in series.params.items() if c.module == module and len(c.shape) >= 2]

    own = weights(name)
    if own:
        return name, own
    order = series.order
    for other in reversed(order[:order.index(name)] if name in order else []):
        if not is_ancestor(other, name) and weights(other):
            return other, weights(other)
    return None, []


def _dead(series: RunSeries, i: int, step: int, th: dict[str, float]) -> list[StatsFinding]:
    cands = []
    for name in series.order:
        zf = series.at(name, "activation", "zero_frac", i)
        mn = series.at(name, "activation", "min", i)
        if zf is None or zf < th["dead_zero_frac"]:
            continue
        if series.at(name, "activation", "input_rms", i) == 0:
            continue  # its input is already all zero: a consequence of a dead module before it
        if series.modules[name].type in RELU_LIKE or (mn is not None and mn >= 0):
            cands.append(name)
    out = []
    for name in _downstream_of_a_cut(series, i, innermost(cands), th):
        feeder, weights = feeding_weights(series, name)
        dead_rows = [v for v in (cell(series.params[p].dead_rows, i) for p in weights) if v is not None]
        if _zero_multiplier(series, i, name):
            scales = own_params(series, name)
            if not (scales and scale_moves(series, scales)):  # a zero-initialised scale that learns is healthy
                out.append(_zero_scale_finding(series, i, step, name, feeder, max(dead_rows) if dead_rows else None))
            continue
        if weights and not dead_rows:
            continue  # its weights get no gradient at all: frozen by design (or not in the optimizer)
        if dead_rows and max(dead_rows) < th["dead_unit_frac"]:
            continue  # gradients reach its units: sparse (each unit fires for some inputs), not dead
        out.append(_dead_finding(series, i, step, name, feeder, max(dead_rows) if dead_rows else None))
    return out


def _previous(series: RunSeries, i: int, name: str) -> str | None:
    """The nearest module before ``name`` in execution order that is neither its container nor inside it."""
    order = series.order
    pos = order.index(name)
    return next((o for o in reversed(order[:pos]) if o and not is_ancestor(o, name) and not is_ancestor(name, o)
                 and series.at(o, "activation", "rms", i) is not None), None)


def _input_max(series: RunSeries, i: int, name: str) -> tuple[float | None, str]:
    """The largest input element of ``name`` at step index ``i`` and where it was read: its own input,
    else the output of the module before it (None when neither is known)."""
    top = series.at(name, "activation", "input_max", i)
    if top is not None:
        return top, "its input"
    before = _previous(series, i, name)
    top = series.at(before, "activation", "max", i) if before is not None else None
    return top, f"the output of {before}"


def _zero_multiplier(series: RunSeries, i: int, name: str) -> bool:
    """``name`` multiplies its input by an exact zero rather than thresholding it: it is not ReLU-like,
    has no weight of two or more dimensions, outputs exactly zero everywhere, and its own parameters are
    all zero or its input holds positive values (which an activation would pass)."""
    if series.modules[name].type in RELU_LIKE or series.at(name, "activation", "zero_frac", i) != 1.0:
        return False
    own = own_params(series, name)
    if any(len(series.params[p].shape) >= 2 for p in own):
        return False
    top, _ = _input_max(series, i, name)
    return bool(own and zero_scale_params(series, name, i)) or (top is not None and top > 0)


def _zero_scale_finding(series: RunSeries, i: int, step: int, name: str, feeder: str | None,
                        dead_rows: float | None) -> StatsFinding:
    top, where = _input_max(series, i, name)
    in_rms = series.at(name, "activation", "input_rms", i)
    scales = own_params(series, name)
    frozen = [p for p in scales if not series.params[p].requires_grad]
    based_on = [f"{label(name)} outputs exactly zero for 100.0% of its values at step {step}",
                f"{where} has rms {fmt(in_rms)} and max {fmt(top)}: positive values that an activation would pass"]
    evidence = {"zero_frac": 1.0, "input_rms": in_rms, "input_max": top, "input_max_of": where, "scale_parameters": scales}
    if scales:
        based_on.append(f"its parameter(s) {', '.join(scales)} are exactly zero on every sampled step and got "
                        + ("no gradient (requires_grad False)" if frozen else "no gradient (None or exactly zero)"))
        cause = (f"its scale parameter(s) {', '.join(scales)} stay at exactly zero: "
                 + ("they are frozen (requires_grad False)" if frozen else "they get no gradient, so they "
                    "never move off zero (whatever they multiply is zero too, e.g. a zero-initialised layer inside)"))
        action = (f"let {label(name)}'s scale learn: " + ("set requires_grad_(True) on it" if frozen else
                  "initialise either the scale or the branch it multiplies non-zero (not both at zero)")
                  + "; a zero-initialised learnable scale (ReZero, LayerScale) is fine when the branch it gates is not zero")
    else:
        based_on.append(f"{label(name)} has no parameter in the optimizer: its multiplier is a buffer or a constant")
        cause = ("it has no trained parameter (its multiplier is a buffer or a constant), so it stays at zero and the "
                 "branch through it contributes nothing")
        action = (f"make {label(name)}'s scale an nn.Parameter (and pass it to the optimizer) so that it can learn from "
                  "zero like ReZero/LayerScale, or initialise it non-zero; if the branch is meant to be off, remove it")
    if dead_rows is not None and feeder is not None:
        evidence.update({"weights": feeder, "dead_rows": dead_rows})
        based_on.append(f"{dead_rows:.0%} of the units of {feeder} (rows of its weight) got exactly zero gradient")
        cause += f"; no gradient flows back through it, so {feeder} gets exactly zero gradient and stops learning"
    return finding(
        "zero_scale", name, step, "error",
        f"{label(name)} outputs exactly zero at step {step} while its input does not (rms {fmt(in_rms)}, max "
        f"{fmt(top)}): it multiplies its input by an exact zero (a scale or gate at 0), not a dead activation; {cause}.",
        action, evidence, based_on=based_on,
    )


def _dead_finding(series: RunSeries, i: int, step: int, name: str, feeder: str | None,
                  dead_rows: float | None) -> StatsFinding:
    """The dead-units finding, its cause chosen from the evidence: weights that are exactly zero (a
    zero-initialised layer nothing moves), else negative pre-activations, citing the input's maximum
    when it is known (else the output of the module called before it, said to be that)."""
    zf = series.at(name, "activation", "zero_frac", i)
    top = series.at(name, "activation", "input_max", i)
    evidence = {"zero_frac": zf, "input_rms": series.at(name, "activation", "input_rms", i), "input_max": top}
    based_on = [f"{label(name)} outputs exactly zero for {zf:.1%} of its values"]
    zero_weights = [p for p in own_params(series, name) if len(series.params[p].shape) >= 2
                    and cell(series.params[p].weight_norm, i) == 0]
    if dead_rows is not None:
        evidence.update({"weights": feeder, "dead_rows": dead_rows})
        based_on.append(f"{dead_rows:.0%} of the units of {feeder} (rows of its weight) got exactly zero gradient")
        flow = (f" {dead_rows:.0%} of the units of {feeder} get exactly zero gradient: no gradient flows back "
                "through them, so they and the layers before them stop learning.")
    else:
        based_on.append("no parameter statistics: judged by the zero fraction alone")
        flow = " No gradient flows back through zero outputs, so the layers before it stop learning."
    if zero_weights:
        evidence["zero_weights"] = zero_weights
        based_on.append(f"{', '.join(zero_weights)}: weight norm 0 at step {step}")
        cause = (f"its weight(s) {', '.join(zero_weights)} are exactly zero: a zero-initialised layer that no gradient "
                 "moves")
        action = (f"initialise {label(name)} non-zero; if it is zero-initialised on purpose (LoRA B, a zero-init "
                  "residual projection), what multiplies its output must not be zero too (a zero scale or gate after it "
                  "keeps both at zero)")
        return finding("dead_activation", name, step, "error",
                       f"{label(name)} outputs exactly zero for {zf:.1%} of its values at step {step}: {cause}.{flow}",
                       action, evidence, based_on=based_on)
    detail = ""
    if top is not None:
        based_on.append(f"its input has max {fmt(top)} at step {step}")
        detail = (f" Its input is at most {fmt(top)} everywhere." if top <= 0 else
                  f" Its input reaches {fmt(top)}, but {zf:.1%} of the values it passes are zero.")
    else:
        before = _previous(series, i, name)
        if before is not None:
            pm, pmax = series.at(before, "activation", "mean", i), series.at(before, "activation", "max", i)
            evidence.update({"previous_module": before, "previous_mean": pm, "previous_max": pmax})
            detail = f" The module called before it, {before}, outputs mean {fmt(pm)}, max {fmt(pmax)}."
    return finding(
        "dead_activation", name, step, "error",
        f"{label(name)} outputs exactly zero for {zf:.1%} of its values at step {step}: its units are dead "
        f"(the pre-activation is negative almost everywhere).{flow}{detail}",
        "check the bias and initialisation of the layer feeding it (a large negative bias, or weights that push "
        "pre-activations negative), lower the learning rate, or use LeakyReLU/GELU or a normalisation layer before it",
        evidence, based_on=based_on,
    )


def _downstream_of_a_cut(series: RunSeries, i: int, dead: list[str], th: dict[str, float]) -> list[str]:
    """``dead`` without the modules that are dead only because an earlier dead module cut the
    signal: their input rms is at most ``vanish_gain`` times that dead module's input rms."""
    order = series.order
    keep: list[str] = []
    for name in dead:
        rms_in = series.at(name, "activation", "input_rms", i)
        cut = rms_in is not None and any(
            order.index(d) < order.index(name)
            and rms_in <= th["vanish_gain"] * (series.at(d, "activation", "input_rms", i) or 0)
            for d in keep
        )
        if not cut:
            keep.append(name)
    return keep


# -- scale -----------------------------------------------------------------------------------


def gated_by_zero_init_scales(series: RunSeries) -> set[str]:
    """The zero-initialised learnable scales that learn (ReZero, LayerScale) and the modules of the
    branch each one multiplies (those before it in execution order inside the same container): their
    signal and gradient start small on purpose and grow as the scale does."""
    order = series.order
    out: set[str] = set()
    for name in order:
        if name and zero_init_scale(series, name):
            parent = name.rsplit(".", 1)[0] if "." in name else ""
            out.add(name)
            out.update(o for o in order[:order.index(name)] if is_ancestor(parent, o) and not is_ancestor(o, name))
    return out


def _activation_scale(series: RunSeries, i: int, step: int, th: dict[str, float],
                      gated: set[str]) -> list[StatsFinding]:
    order = series.order
    explode, vanish = [], []
    for name in order:
        gain = series.at(name, "activation", "gain", i)
        rms = series.at(name, "activation", "rms", i)
        if gain is None or rms is None:
            continue
        if gain >= th["explode_gain"] and rms >= th["explode_rms"]:
            explode.append(name)
        elif 0 < rms <= th["vanish_rms"] and gain <= th["vanish_gain"] and name not in gated:
            vanish.append(name)  # (a zero-initialised scale that learns starts small on purpose)
    out = []
    for name in innermost(explode):
        gain = series.at(name, "activation", "gain", i)
        rms = series.at(name, "activation", "rms", i)
        in_rms = series.at(name, "activation", "input_rms", i)
        peak = max(abs(series.at(name, "activation", "min", i) or 0), abs(series.at(name, "activation", "max", i) or 0))
        after = [o for o in order[order.index(name) + 1:] if (series.at(o, "activation", "rms", i) or 0) >= th["explode_rms"]]
        out.append(finding(
            "exploding_activation", name, step, "error",
            f"{label(name)} multiplies the scale of its input by {gain:.3g}x at step {step} (input rms {fmt(in_rms)}, "
            f"output rms {fmt(rms)}, max |x| {fmt(peak)}); {len(after)} module(s) after it carry the blown-up values.",
            f"check the initialisation scale of {label(name)}'s weights (e.g. std far above 1/sqrt(fan_in)) and any "
            "scaling factor in its forward; re-initialise it (nn.init.kaiming_uniform_/xavier) or add a normalisation layer",
            {"gain": gain, "input_rms": in_rms, "output_rms": rms, "modules_after": len(after)},
        ))
    model_in = _model_input_rms(series, i)
    if not explode:
        floor = max(th["explode_abs_rms"], th["explode_gain"] * (model_in or 0.0))
        first = next((n for n in order if (series.at(n, "activation", "rms", i) or 0) >= floor), None)
        if first is not None:
            rms = series.at(first, "activation", "rms", i)
            out.append(finding(
                "exploding_activation", first, step, "error",
                f"Activations grow layer by layer and reach rms {fmt(rms)} at {label(first)} at step {step}; "
                "no single module is to blame: the growth accumulates with depth.",
                "use a smaller initialisation scale, residual scaling or normalisation layers (LayerNorm/BatchNorm)",
                {"output_rms": rms},
            ))
    for name in innermost(vanish):
        gain = series.at(name, "activation", "gain", i)
        out.append(finding(
            "vanishing_activation", name, step, "warning",
            f"{label(name)} shrinks the scale of its input by {1 / gain:.3g}x at step {step} (input rms "
            f"{fmt(series.at(name, 'activation', 'input_rms', i))}, output rms "
            f"{fmt(series.at(name, 'activation', 'rms', i))}): the signal after it is nearly zero.",
            f"check the initialisation scale of {label(name)} (weights far below 1/sqrt(fan_in)) and any scaling in its "
            "forward; if it is initialised to zero on purpose (LoRA, zero-init residual), ignore this",
            {"gain": gain},
        ))
    if not vanish and model_in:
        limit = min(th["vanish_abs_rms"] * model_in, th["vanish_rms"])
        first = next((n for n in order if 0 < (series.at(n, "activation", "rms", i) or model_in) < limit
                      and n not in gated), None)
        if first is not None:
            rms = series.at(first, "activation", "rms", i)
            out.append(finding(
                "vanishing_activation", first, step, "warning",
                f"Activations shrink layer by layer to rms {fmt(rms)} at {label(first)} (the model's input rms is "
                f"{fmt(model_in)}) at step {step}: the signal fades with depth.",
                "use an initialisation that preserves scale (kaiming for ReLU, xavier for tanh), residual connections "
                "or normalisation layers",
                {"output_rms": rms, "model_input_rms": model_in},
            ))
    return out


def _model_input_rms(series: RunSeries, i: int) -> float | None:
    """The input rms of the first module in execution order (the root) at step index ``i``."""
    return series.at(series.order[0], "activation", "input_rms", i) if series.order else None


# -- saturation ------------------------------------------------------------------------------


def _saturation(series: RunSeries, i: int, step: int, th: dict[str, float]) -> list[StatsFinding]:
    out = []
    for name in series.order:
        sf = series.at(name, "activation", "sat_frac", i)
        if sf is None or sf < th["saturation_frac"]:
            continue
        out.append(finding(
            "saturation", name, step, "warning",
            f"{sf:.1%} of the outputs of {label(name)} ({series.modules[name].type}) sit at the ends of its range "
            f"at step {step}: there its gradient is almost zero, so the layers before it learn slowly.",
            "scale down the pre-activations (smaller initialisation or learning rate), add a normalisation layer "
            "before it, or use an activation that does not saturate",
            {"sat_frac": sf, "input_rms": series.at(name, "activation", "input_rms", i)},
        ))
    return out


def _softmax_saturation(series: RunSeries, i: int, step: int, th: dict[str, float]) -> list[StatsFinding]:
    out = []
    output_level = {"", series.order[-1]} if series.order else {""}
    for name in series.order:
        top = series.at(name, "softmax", "max_prob", i)
        entropy = series.at(name, "softmax", "entropy", i)
        if (name in output_level or top is None or entropy is None or top < th["softmax_max_prob"]
                or entropy > th["softmax_entropy"]):
            continue
        m = series.modules[name]
        onehot = m.at("softmax", "onehot_frac", i)
        first = next((k for k in range(i + 1) if m.at("softmax", "entropy", k) is not None), i)
        was = m.at("softmax", "entropy", first)
        attention = "scaled_dot_product_attention" in m.softmax_source
        what = "attention weights (recomputed from q and k of scaled_dot_product_attention)" if attention else "softmax"
        trend = f"; at step {series.steps[first]} it was {was:.2f}" if first < i and was is not None else ""
        based_on = [f"mean largest probability {top:.3g} of the {what} in {label(name)} at step {step}, "
                    f"{fmt(onehot)} of the rows at >= 0.99", f"mean entropy {entropy:.3f} of its maximum{trend}"]
        out.append(finding(
            "softmax_saturation", name, step, "warning",
            f"The {what} in {label(name)} are nearly one-hot at step {step}: the mean largest probability is "
            f"{top:.3g} and {fmt(onehot)} of the rows put at least 0.99 of their mass on a single entry (entropy "
            f"{entropy:.3f} of its maximum{trend}). A saturated softmax passes almost no gradient, and attention that "
            "looks at one token no longer mixes information.",
            "scale its logits down: check the 1/sqrt(head_dim) scaling of q.k, the initialisation scale of the q and k "
            "projections and the learning rate; QK-normalisation (a LayerNorm on q and k) or a softmax temperature "
            "keeps the logits bounded",
            {"max_prob": top, "entropy": entropy, "onehot_frac": onehot, "entropy_first": was if first < i else None},
            based_on=based_on,
        ))
    return out


# -- gradients -------------------------------------------------------------------------------


def _healthy_gradient_reference(grads: list[float], th: dict[str, float]) -> float:
    """The median gradient rms of the healthy leaves (``grads`` in execution order, all > 0): those
    within the rules' band around the loss end (the median of the last :data:`LOSS_END` leaves)."""
    end = statistics.median(grads[-LOSS_END:])
    healthy = [v for v in grads if th["vanish_grad_ratio"] * end < v < th["explode_grad_ratio"] * end]
    return statistics.median(healthy) if healthy else end


def _gradients(series: RunSeries, i: int, step: int, th: dict[str, float],
               dead: list[StatsFinding], gated: set[str]) -> list[StatsFinding]:
    g = {n: series.at(n, "gradient", "rms", i) for n in leaves(series)}
    seq = [n for n, v in g.items() if v is not None]
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
        out.append(finding(
            "exploding_gradient", culprit, step, "error",
            f"Gradients grow as they flow backward through {label(culprit)} at step {step}: the gradient at the output "
            f"of {last_big} has rms {fmt(g[last_big])}, {g[last_big] / ref:.3g}x the median over healthy modules "
            f"({fmt(ref)}); {len(big)} module(s) before it get such gradients.",
            f"check the weight scale of {label(culprit)}; clip gradients (torch.nn.utils.clip_grad_norm_), lower the "
            "learning rate, or add normalisation",
            {"gradient_rms": g[last_big], "median_gradient_rms": ref, "modules_affected": len(big)},
        ))
    dead_pos = [seq.index(d.module) for d in dead if d.module in seq]
    last_dead = max(dead_pos) if dead_pos else -1
    # Exactly zero is no path on this step (an expert no token chose, a branch not taken), not fading.
    small = [n for k, n in enumerate(seq) if 0 < g[n] <= th["vanish_grad_ratio"] * ref and not (k < last_dead)
             and n not in gated]
    if small:
        last_small = small[-1]
        out.append(finding(
            "vanishing_gradient", last_small, step, "warning",
            f"Gradients fade as they flow backward: at the output of {label(last_small)} the gradient rms is "
            f"{fmt(g[last_small])}, {g[last_small] / ref:.2g}x the median over healthy modules ({fmt(ref)}) at step "
            f"{step}; {len(small)} module(s) get such small gradients and barely learn.",
            "look for saturating activations (sigmoid/tanh) or a too-small initialisation along the path; use ReLU/GELU, "
            "residual connections, normalisation layers or a scale-preserving initialisation",
            {"gradient_rms": g[last_small], "median_gradient_rms": ref, "modules_affected": len(small)},
        ))
    return out
