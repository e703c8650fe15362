"""The action of a finding, from the evidence across modules and steps (and which evidence it was).

An exploding activation or gradient can come from one layer (its initialisation, the scale of its
input) or from the training as a whole (a learning-rate spike, a missing gradient clip). The
sampled steps tell them apart:

- a *global jump*: at the step where the finding first held, the output rms of at least half of
  the modules rose ``jump_factor`` times or more since the previous sampled step;
- an *update spike*: at that step or before, the update-to-weight ratio of at least half of the
  trained parameters rose ``spike_factor`` times or more above their median over the earlier
  sampled steps (the optimizer moved every weight much further than before: the learning rate);
- a *gradient spike*: the same for the gradient-to-weight ratio (a bad batch, a loss spike).

A global jump with an update spike gets learning-rate advice (schedule, peak rate, clipping); with
a gradient spike, clipping; a jump of one module, or a finding present from the first sampled step,
gets advice about that module's initialisation and input scale; an update spike in one layer only
(:func:`modulelens.stats.param_rules.param_spikes`) before the finding gets advice about that layer's
learning rate, and modules that output the same tensor as one of their submodules (the root
returning its head's output) count once in a jump. The observations used are listed
in the finding's ``based_on``. NaN/Inf findings born in the optimizer, or spread by it, get the
update-spike evidence too.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from modulelens.stats.judging import is_ancestor, label
from modulelens.stats.param_rules import ParamSpike, param_spikes
from modulelens.stats.schema import RunSeries, StatsFinding, cell

SCALE_KINDS = {"exploding_activation", "exploding_gradient"}


@dataclass
class Spike:
    """Parameters whose ``column`` rose ``spike_factor``-fold above their earlier median at one step."""

    step: int
    params: list[str]
    total: int
    before: float  # median over the spiking parameters of their earlier median
    at: float  # median over them at the spike

    def says(self, what: str) -> str:
        return (f"the {what} of {len(self.params)} of {self.total} parameters rose {self.at / self.before:.3g}x above "
                f"its earlier median at step {self.step} (median {self.before:.3g} -> {self.at:.3g})")


_SAME_TENSOR = ("rms", "mean", "min", "max", "zero_frac")


def same_tensor_as_a_descendant(series: RunSeries, name: str, i: int) -> bool:
    """``name`` outputs the very tensor one of its submodules outputs on steps ``i - 1`` and ``i``
    (a container returning its last child's output; the root returning the head's): identical
    statistics, since each tensor is reduced once per step."""
    def stats(m: str, k: int) -> tuple:
        return tuple(series.at(m, "activation", s, k) for s in _SAME_TENSOR)

    mine = [stats(name, k) for k in (i - 1, i)]
    return any(is_ancestor(name, o) and [stats(o, k) for k in (i - 1, i)] == mine for o in series.order)


def activation_jump(series: RunSeries, i: int, factor: float) -> tuple[list[str], int]:
    """(modules whose output rms rose ``factor``-fold from step index i-1 to i, modules compared);
    a module outputting the same tensor as one of its submodules counts once (as the submodule)."""
    if i < 1:
        return [], 0
    jumped, compared = [], 0
    for name in series.order:
        if same_tensor_as_a_descendant(series, name, i):
            continue
        a, b = series.at(name, "activation", "rms", i - 1), series.at(name, "activation", "rms", i)
        if a and b is not None and a > 0:
            compared += 1
            if b >= factor * a:
                jumped.append(name)
    return jumped, compared


def spike(series: RunSeries, upto: int, column: str, factor: float) -> Spike | None:
    """The earliest sampled step at or before index ``upto`` where at least half of the parameters
    with values there and before rose ``factor``-fold above their earlier median in ``column``
    (``update_ratio`` or ``grad_to_weight``)."""
    for k in range(1, upto + 1):
        found = spike_at(series, k, column, factor)
        if found is not None:
            return found
    return None


def spike_at(series: RunSeries, k: int, column: str, factor: float) -> Spike | None:
    """The spike of :func:`spike` at exactly step index ``k``, if there is one."""
    rising, total, befores, ats = [], 0, [], []
    for name, p in series.params.items():
        col = getattr(p, column)
        now = cell(col, k)
        if not isinstance(now, (int, float)):
            continue
        earlier = [v for v in (cell(col, j) for j in range(k)) if isinstance(v, (int, float)) and v > 0]
        if not earlier:
            continue
        total += 1
        med = statistics.median(earlier)
        if now >= factor * med:
            rising.append(name)
            befores.append(med)
            ats.append(now)
    if total and len(rising) * 2 >= total:
        return Spike(series.steps[k], rising, total, statistics.median(befores), statistics.median(ats))
    return None


def advise(series: RunSeries, f: StatsFinding, th: dict[str, float]) -> StatsFinding:
    """``f`` with the action and ``based_on`` that the evidence across modules and steps supports."""
    if f.kind in SCALE_KINDS:
        return _scale(series, f, th)
    if f.kind in ("nan_inf", "nan_inf_gradient") and (f.phase in ("optimizer", None)):
        return _nan(series, f, th)
    return f


def _index(series: RunSeries, step: int | None) -> int:
    return series.steps.index(step) if step in series.steps else len(series.steps) - 1


def _scale(series: RunSeries, f: StatsFinding, th: dict[str, float]) -> StatsFinding:
    i = _index(series, f.first_step if f.first_step is not None else f.step)
    step = series.steps[i]
    jumped, compared = activation_jump(series, i, th["jump_factor"])
    updates = spike(series, i, "update_ratio", th["spike_factor"])
    grads = spike(series, i, "grad_to_weight", th["spike_factor"])
    based_on = list(f.based_on)
    local = layer_update_spike(series, i, th) if updates is None else None
    if compared >= 3 and len(jumped) * 2 >= compared and local is None:
        prev = series.steps[i - 1]
        based_on.append(f"the output rms of {len(jumped)} of {compared} modules rose {th['jump_factor']:g}x or more "
                        f"between step {prev} and step {step}: the whole model changed at once, not one layer")
        if updates is not None:
            based_on.append(updates.says("update/weight ratio") + ", before or at the jump")
            action = (f"the learning rate: the optimizer moved the weights much further at step {updates.step} than "
                      "before, and every layer blew up after it. Check the learning-rate schedule (a warm-up or decay "
                      "bug, a restart, a wrong unit), lower the peak learning rate, and clip gradients "
                      "(torch.nn.utils.clip_grad_norm_) so that one step cannot move the weights this far")
        elif grads is not None:
            based_on.append(grads.says("gradient/weight ratio"))
            action = (f"clip gradients (torch.nn.utils.clip_grad_norm_): a gradient spike at step {grads.step} (a bad "
                      "batch or a loss spike) moved every layer at once; look at the batch and the loss at that step")
        else:
            based_on.append("no update or gradient spike was seen on the sampled steps before it")
            action = ("lower the learning rate and clip gradients (torch.nn.utils.clip_grad_norm_): the weights of "
                      "every layer changed at once between the two steps; sample more often (a smaller --every) to see "
                      "the step where it starts")
        return f.model_copy(update={"action": action, "based_on": based_on})
    if i == 0:
        based_on.append(f"it holds from the first sampled step (step {step}): it comes with the initialisation or the "
                        "input, not with training")
    elif compared and (len(jumped) * 2 < compared or compared < 3):
        based_on.append(f"only {len(jumped)} of {compared} modules' output rms rose {th['jump_factor']:g}x or more "
                        f"between step {series.steps[i - 1]} and step {step}: this is local to {label(f.module)}")
        if updates is None and local is None:
            based_on.append("no update spike on the sampled steps before it: not the learning rate")
    elif compared:  # most modules jumped, after an update spike in one layer (they come after it)
        based_on.append(f"the output rms of {len(jumped)} of {compared} modules rose {th['jump_factor']:g}x or more "
                        f"between step {series.steps[i - 1]} and step {step}")
    if i > 0 and local is not None:
        k, hit = local
        owner = series.params[hit.param].module
        based_on.append(hit.says(series.steps[k]) + f", before or at step {step}: an update spike in {label(owner)} "
                        "alone")
        action = (f"the learning rate of {label(owner)}'s parameters: the optimizer moved {hit.param} {hit.value:.3g} of "
                  f"its norm at step {series.steps[k]} while the other layers' updates stayed normal. Check the learning "
                  f"rate of the parameter group holding {label(owner)} (a per-group multiplier or schedule), and clip "
                  "gradients (torch.nn.utils.clip_grad_norm_) so that one step cannot move the weights this far")
        return f.model_copy(update={"action": action, "based_on": based_on})
    in_rms = series.at(f.module, "activation", "input_rms", i)
    if in_rms is not None:
        based_on.append(f"the input of {label(f.module)} has rms {in_rms:.3g} at step {step}")
    action = f.action
    if in_rms is not None and in_rms > th["explode_rms"]:
        action += f"; its input is already large (rms {in_rms:.3g}): scale it down where it is made (normalise the data)"
    return f.model_copy(update={"action": action, "based_on": based_on})


def layer_update_spike(series: RunSeries, upto: int, th: dict[str, float]) -> tuple[int, ParamSpike] | None:
    """The latest step index at or before ``upto`` where a weight's update/weight ratio spiked (see
    :func:`modulelens.stats.param_rules.param_spikes`), with the largest such spike there."""
    for k in range(upto, -1, -1):
        hits = [s for s in param_spikes(series, k, th) if s.column == "update_ratio"]
        if hits:
            return k, max(hits, key=lambda s: s.value)
    return None


def _nan(series: RunSeries, f: StatsFinding, th: dict[str, float]) -> StatsFinding:
    i = _index(series, f.first_step if f.first_step is not None else f.step)
    updates = spike(series, i, "update_ratio", th["spike_factor"])
    if updates is None:
        return f
    based_on = [*f.based_on, updates.says("update/weight ratio") + f", before NaN/Inf appeared at step {f.step}"]
    action = (f"the learning rate: the updates spiked at step {updates.step} before the weights turned NaN/Inf; check "
              f"the learning-rate schedule, lower the peak learning rate and clip gradients. Then: {f.action}")
    return f.model_copy(update={"action": action, "based_on": based_on})
