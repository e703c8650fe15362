"""The rules over parameter statistics (see :func:`modulelens.stats.findings.evaluate`):

- ``no_gradient`` (over the whole run): parameters that require grad and are in the optimizer but
  whose ``.grad`` was None or exactly zero on every sampled step where their module ran. They never learn. The finding names
  where the graph is cut: the outermost module all of whose parameters got no gradient (its output
  gradient None: nothing reached its output; a ``.detach()``, ``torch.no_grad`` or ``.data`` between it
  and the loss). Frozen parameters (requires_grad False, or left out of the optimizer, which are not
  measured) are not judged, nor, when the run has a dead-activation or zero-multiplier finding, parameters
  whose gradient is exactly zero (not None): a dead unit cuts the gradient of its whole path.
- ``exploding_parameter_gradient`` / ``exploding_update`` (each sampled step): a weight of two or more
  dimensions whose gradient/weight ratio is at least ``grad_to_weight_abs``, or whose update/weight
  ratio is at least ``update_ratio_abs``, *and* ``spike_factor`` times its median over the run's other
  sampled steps (with fewer than two such steps: at least ``grad_to_weight_alone`` /
  ``update_ratio_alone``). For the gradient the history includes later steps, so a gradient that
  explodes on the first sampled step is found; for the update only earlier steps count (an adaptive
  optimizer's first step, Adam's lr times the sign of the gradient, moves small weights several times
  further than its later steps by design), so a first-step update must reach ``update_ratio_alone``. Not judged on a step where the rules already see a model-wide spike (at least half of the
  parameters rose ``spike_factor``-fold above their earlier median: the run's learning rate or a bad
  batch, which the scale findings' advice names, :mod:`modulelens.stats.advice`), nor on a step with an
  exploding activation or gradient finding. Steps where the weight is still growing from zero (its norm below 1/``spike_factor`` of its
  median norm: a zero-initialised layer) are not judged. This sees an explosion summed inside one
  module (a recurrent layer's gradient over its time steps) that the module-output gradients hide.

Zero-initialised learnable scales (ReZero, LayerScale, zero-init gates) are recognised by
:func:`zero_scale_params` and :func:`scale_moves`; see :mod:`modulelens.stats.rules`.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from modulelens.stats.judging import finding, fmt, is_ancestor, label
from modulelens.stats.schema import ParamColumns, RunSeries, StatsFinding, cell

RECURRENT = {"RNN", "LSTM", "GRU", "RNNCell", "LSTMCell", "GRUCell"}


def _num(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def own_params(series: RunSeries, module: str) -> list[str]:
    """The measured parameters that ``module`` owns directly."""
    return [p for p, c in series.params.items() if c.module == module]


def zero_scale_params(series: RunSeries, module: str, i: int) -> list[str]:
    """``module``'s own parameters when it is a scale (no parameter of two or more dimensions) whose
    parameters are all exactly zero at step index ``i``; else []."""
    own = own_params(series, module)
    if not own or any(len(series.params[p].shape) >= 2 for p in own):
        return []
    return own if all(_num(cell(series.params[p].weight_norm, i)) == 0.0 for p in own) else []


def scale_moves(series: RunSeries, params: list[str]) -> bool:
    """True when any of ``params`` requires grad and got a non-zero gradient or a non-zero value on
    some sampled step: a zero-initialised scale that is learning."""
    for p in params:
        c = series.params[p]
        if not c.requires_grad:
            continue
        if any((_num(v) or 0.0) > 0 for v in c.grad_norm) or any((_num(v) or 0.0) > 0 for v in c.weight_norm):
            return True
    return False


def zero_init_scale(series: RunSeries, module: str) -> bool:
    """``module`` is a learnable scale that starts at exactly zero and learns (ReZero, LayerScale)."""
    own = own_params(series, module)
    if not own or any(len(series.params[p].shape) >= 2 for p in own):
        return False
    first = next((k for k in range(len(series.steps)) if cell(series.params[own[0]].weight_norm, k) is not None), None)
    return first is not None and bool(zero_scale_params(series, module, first)) and scale_moves(series, own)


# -- gradient flow ---------------------------------------------------------------------------


def _gradless(series: RunSeries, c: ParamColumns, judged: int) -> list[int] | None:
    """The step indices where ``c`` was measured and its module ran, when its gradient was None or
    zero on all of them (a module that did not run on a step, a branch not taken, is not judged there)."""
    measured = [k for k in range(judged) if (cell(c.weight_norm, k) is not None or cell(c.grad_norm, k) is not None)
                and series.at(c.module, "activation", "count", k) is not None]
    if not measured or any((_num(cell(c.grad_norm, k)) or 0.0) != 0.0 for k in measured):
        return None
    return measured


def _params_under(series: RunSeries, module: str) -> list[str]:
    return [p for p, c in series.params.items() if c.module == module or is_ancestor(module, c.module)]


def _cut(series: RunSeries, owner: str, gradless: set[str]) -> str:
    """The outermost module containing ``owner`` all of whose measured parameters are in ``gradless``."""
    cut = owner
    while cut:
        parent = cut.rsplit(".", 1)[0] if "." in cut else ""
        under = _params_under(series, parent)
        if parent not in series.modules or not under or not set(under) <= gradless:
            break
        cut = parent
    return cut


def gradient_flow(series: RunSeries, judged: int, explained: set[str]) -> list[StatsFinding]:
    """``no_gradient`` findings over the steps before index ``judged`` (``explained``: modules whose
    weights' zero gradient another finding explains)."""
    steps: dict[str, list[int]] = {}
    for p, c in series.params.items():
        if not c.requires_grad or c.module in explained:
            continue
        measured = _gradless(series, c, judged)
        # An exactly-zero gradient behind a dead unit or a zero multiplier is explained by that finding.
        if measured is not None and (not explained or all(cell(c.grad_norm, k) is None for k in measured)):
            steps[p] = measured
    groups: dict[str, list[str]] = {}
    for p in steps:
        groups.setdefault(_cut(series, series.params[p].module, set(steps)), []).append(p)
    return [_no_gradient_finding(series, cut, params, steps) for cut, params in groups.items()]


def _no_gradient_finding(series: RunSeries, cut: str, params: list[str], steps: dict[str, list[int]]) -> StatsFinding:
    measured = sorted({k for p in params for k in steps[p]})
    first, last = series.steps[measured[0]], series.steps[measured[-1]]
    values = [cell(series.params[p].grad_norm, k) for p in params for k in steps[p]]
    grad = ("None" if all(v is None for v in values) else "exactly zero" if all(v is not None for v in values)
            else "None or exactly zero")
    moved = [v for p in params for v in (_num(cell(series.params[p].update_ratio, k)) for k in steps[p]) if v is not None]
    out_grads = [series.at(cut, "gradient", "rms", k) for k in measured]
    names = ", ".join(params[:4]) + (f" and {len(params) - 4} more" if len(params) > 4 else "")
    based_on = [f"{len(params)} parameter(s) of {label(cut)} ({names}) require grad and are in the optimizer; their "
                f".grad was {grad} on all {len(measured)} sampled steps (steps {first} to {last})"]
    if moved:
        based_on.append(f"their update/weight ratio was at most {max(moved):.3g} on those steps")
    if all(g is None for g in out_grads):
        based_on.append(f"the gradient w.r.t. the output of {label(cut)} is None on every sampled step: no gradient "
                        "reached it")
        where = (f"the graph is cut at the output of {label(cut)}: no gradient reaches it (a .detach(), torch.no_grad(), "
                 ".data or a non-differentiable step such as .item()/numpy between it and the loss)")
        action = (f"remove the .detach()/torch.no_grad()/.data on the path from {label(cut)}'s output to the loss; if "
                  f"{label(cut)} is meant to stay fixed, freeze it on purpose: requires_grad_(False) on its parameters "
                  "and leave them out of the optimizer")
    elif not any(out_grads):
        based_on.append(f"the gradient w.r.t. the output of {label(cut)} is exactly zero (or None) on every sampled "
                        "step: what uses its output passes no gradient back")
        where = (f"the gradient reaching the output of {label(cut)} is exactly zero: what uses its output multiplies it "
                 "by zero or cuts it (a zero scale or gate, a constant-zero branch, a dead unit after it)")
        action = (f"look at what consumes {label(cut)}'s output on the way to the loss: a scale, gate or mask that is "
                  "exactly zero, or a branch whose result is discarded; if it is meant to stay fixed, set "
                  "requires_grad_(False) and leave it out of the optimizer")
    else:
        g = max((v for v in out_grads if v is not None), default=None)
        based_on.append(f"the gradient w.r.t. the output of {label(cut)} has rms up to {fmt(g)}: gradient reaches its "
                        "output but not its parameters")
        where = (f"gradient reaches the output of {label(cut)} but not its parameters: inside its forward they are used "
                 "through .detach(), .data, torch.no_grad() or a non-differentiable op, or multiplied by an exact zero")
        action = (f"look at how {label(cut)}'s forward uses its parameters (detach/.data/no_grad, integer casts, "
                  "argmax); if they are meant to stay fixed, set requires_grad_(False) and leave them out of the optimizer")
    message = (f"{len(params)} trainable parameter(s) of {label(cut)} never get a gradient: their .grad is {grad} on all "
               f"{len(measured)} sampled steps, so they never learn; {where}. They require grad and are in the "
               "optimizer, so this is not a layer frozen by design.")
    f = finding("no_gradient", cut, first, "error", message, action, {
        "parameters": list(params), "grad": grad, "steps": len(measured),
        "max_update_ratio": max(moved) if moved else None, "output_gradient_rms": next((v for v in out_grads if v), None),
    }, based_on=based_on)
    return f.model_copy(update={"first_step": first, "last_step": last, "steps_held": len(measured)})


# -- parameter gradient and update spikes ----------------------------------------------------


@dataclass
class ParamSpike:
    """One weight's gradient/weight or update/weight ratio at a step, against its run's median."""

    param: str
    column: str  # grad_to_weight or update_ratio
    value: float
    median: float | None  # over the run's other sampled steps (None: fewer than two)
    others: int

    def says(self, step: int) -> str:
        what = "gradient/weight ratio" if self.column == "grad_to_weight" else "update/weight ratio"
        if self.median is None:
            return f"{self.param}: {what} {self.value:.3g} at step {step} (no other sampled step to compare with)"
        which = "earlier" if self.column == "update_ratio" else "other"
        return (f"{self.param}: {what} {self.value:.3g} at step {step}, {self.value / self.median:.3g}x its median "
                f"{self.median:.3g} over the {which} {self.others} sampled steps")


def _growing_from_zero(c: ParamColumns, i: int, factor: float) -> bool:
    norms = [v for v in (_num(x) for x in c.weight_norm) if v is not None]
    now = _num(cell(c.weight_norm, i))
    return now is None or not norms or now < statistics.median(norms) / factor


def param_spikes(series: RunSeries, i: int, th: dict[str, float]) -> list[ParamSpike]:
    """The weights (two or more dimensions, requiring grad) whose gradient/weight or update/weight
    ratio at step index ``i`` is above the absolute bound and ``spike_factor`` times the run's median."""
    out = []
    bounds = (("grad_to_weight", th["grad_to_weight_abs"], th["grad_to_weight_alone"]),
              ("update_ratio", th["update_ratio_abs"], th["update_ratio_alone"]))
    for p, c in series.params.items():
        if len(c.shape) < 2 or not c.requires_grad:
            continue
        for column, bound, alone in bounds:
            col = getattr(c, column)
            now = _num(cell(col, i))
            if now is None or now < bound or _growing_from_zero(c, i, th["spike_factor"]):
                continue  # (the bound first: the rest reads the whole run)
            # Update ratios against earlier steps only: an adaptive optimizer's first step (Adam's is lr times
            # the sign of the gradient) moves small weights much further than its later steps, by design.
            span = range(i) if column == "update_ratio" else (k for k in range(len(col)) if k != i)
            others = [v for v in (_num(cell(col, k)) for k in span) if v is not None and v > 0]
            med = statistics.median(others) if len(others) >= 2 else None
            if (med is None and now >= alone) or (med is not None and now >= th["spike_factor"] * med):
                out.append(ParamSpike(p, column, now, med, len(others)))
    return out


def parameter_findings(series: RunSeries, i: int, step: int, th: dict[str, float]) -> list[StatsFinding]:
    """One finding per module owning spiking weights at step index ``i``."""
    by_module: dict[str, list[ParamSpike]] = {}
    for s in param_spikes(series, i, th):
        by_module.setdefault(series.params[s.param].module, []).append(s)
    return [_spike_finding(series, i, step, module, spikes) for module, spikes in by_module.items()]


def _spike_finding(series: RunSeries, i: int, step: int, module: str, spikes: list[ParamSpike]) -> StatsFinding:
    grads = [s for s in spikes if s.column == "grad_to_weight"]
    head = max(grads or spikes, key=lambda s: s.value / (s.median or s.value))
    c = series.params[head.param]
    gn, g2w, ur = (_num(cell(c.grad_norm, i)), _num(cell(c.grad_to_weight, i)), _num(cell(c.update_ratio, i)))
    based_on = [s.says(step) for s in spikes]
    kind_of = series.modules[module].type if module in series.modules else ""
    recurrent = kind_of in RECURRENT
    out_g = series.at(module, "gradient", "rms", i)
    if recurrent:
        based_on.append(f"the gradient w.r.t. the output of {label(module)} has rms {fmt(out_g)} at step {step}: the "
                        f"explosion is summed over the time steps inside {label(module)} ({kind_of}), where the "
                        "module-output gradients do not see it")
    evidence = {"parameter": head.param, "grad_norm": gn, "grad_to_weight": g2w, "update_ratio": ur,
                "median": head.median, "column": head.column, "recurrent": recurrent}
    if grads:
        why = (f" The gradient grows over the time steps inside {label(module)} ({kind_of}): the recurrent weight "
               "multiplies it once per step." if recurrent else
               " Only this layer's weights see it (a loss spike on a batch, or the scale of the layers after it).")
        message = (f"The gradient of {head.param} explodes at step {step}: norm {fmt(gn)}, {fmt(g2w)}x its weight norm"
                   + (f", {head.value / head.median:.3g}x its median over the other sampled steps" if head.median else "")
                   + f"; the optimizer moved it by {fmt(ur)} of its norm in one step.{why}")
        action = ("clip gradients (torch.nn.utils.clip_grad_norm_) before optimizer.step() and lower the learning rate"
                  + ("; initialise the recurrent weight with a spectral radius below 1 (orthogonal with gain <= 1, or "
                     "a scaled identity) or use an LSTM/GRU" if recurrent else
                     f"; look at the loss at step {step} and at the weight scale of {label(module)} and the layers after it"))
        return finding("exploding_parameter_gradient", module, step, "error", message, action, evidence,
                       based_on=based_on)
    message = (f"optimizer.step() moved {head.param} by {fmt(ur)} of its norm at step {step}"
               + (f", {head.value / head.median:.3g}x its median over the earlier sampled steps" if head.median else "")
               + f", while its gradient/weight ratio was {fmt(g2w)}: the step size (the learning rate of its parameter "
               "group), not the gradient, made the jump.")
    action = (f"the learning rate of {label(module)}'s parameters at step {step}: check that parameter group's "
              "learning rate and schedule (a multiplier, a warm-up or restart bug), lower its peak, and clip gradients "
              "(torch.nn.utils.clip_grad_norm_) so that one step cannot move the weights this far")
    return finding("exploding_update", module, step, "error", message, action, evidence, based_on=based_on)
