"""Turn a :class:`~modulelens.stats.records.StatsRun` into the stored series (``series.json``, a
:class:`~modulelens.stats.schema.RunSeries`): per module the statistics of its output
(``activation``), of the gradient w.r.t. its output (``gradient``) and of the softmax it computes
(``softmax``), raw and EMA-smoothed; per parameter its norms, update ratio and zero-gradient rows;
per module type the aggregates; the NaN/Inf events of the sampled steps and, from a rerun, where
NaN/Inf was born. Columns are aligned with ``steps``; None where a module was not called or a value
is undefined.

EMA: ``ema_t = alpha * ema_{t-1} + (1 - alpha) * x_t`` over the sampled steps, starting at the first
value (no bias correction); a step without a value keeps the previous EMA and stores None.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from modulelens.stats import softmax as SM
from modulelens.stats import stats as S
from modulelens.stats.records import ModuleStep, ParamStep, StatsRun
from modulelens.stats.schema import (
    ModuleColumns,
    NanOrigin,
    NonfiniteCall,
    NonfiniteEvent,
    ParamColumns,
    RunSeries,
    TypeColumns,
    cell,
)

DEFAULT_EMA = 0.9  # alpha of the smoothed series
EMA_STATS = {
    "mean", "std", "skew", "kurtosis", "zero_frac", "min", "max", "kl_gauss", "rms", "sat_frac", "gain", "input_rms",
    "input_max",
}
_SUM_STATS = {"nan", "inf", "count", "calls"}
PARAM_COLUMNS = ("weight_norm", "weight_rms", "grad_norm", "grad_rms", "grad_to_weight", "update_ratio", "dead_rows",
                 "nonfinite_weight", "nonfinite_grad")


def _round(x: Any) -> Any:
    if isinstance(x, float):
        if not math.isfinite(x):
            return None
        return float(f"{x:.7g}")
    return x


def activation_stats(ms: ModuleStep) -> dict[str, Any] | None:
    if ms.act is None:
        return None
    out = S.finalize(ms.act, ms.saturation)
    in_rms = math.sqrt(ms.in_sq / ms.in_numel) if ms.in_numel else None
    out["input_rms"] = None if ms.in_nonfinite else in_rms
    out["input_nonfinite"] = ms.in_nonfinite
    out["input_max"] = ms.in_max if ms.in_max_known and not ms.in_nonfinite else None
    rms = out.get("rms")
    out["gain"] = rms / in_rms if (rms is not None and in_rms and not ms.in_nonfinite) else None
    out["calls"] = ms.calls
    return out


def param_stats(ps: ParamStep) -> dict[str, Any]:
    """Norms of one parameter at a sampled step: ``*_rms`` = norm / sqrt(numel); ``grad_to_weight``
    = ||grad|| / ||w||; ``update_ratio`` = ||w_after - w_before|| / ||w_before||."""
    wn, gn = ps.weight_norm, ps.grad_norm
    w_ok = math.isfinite(wn)
    g_ok = gn is None or math.isfinite(gn)
    root = math.sqrt(ps.numel) if ps.numel else None
    return {
        "weight_norm": wn if w_ok else None,
        "weight_rms": wn / root if (w_ok and root) else None,
        "grad_norm": gn if (gn is not None and g_ok) else None,
        "grad_rms": gn / root if (gn is not None and g_ok and root) else None,
        "grad_to_weight": gn / wn if (gn is not None and g_ok and w_ok and wn > 0) else None,
        "update_ratio": ps.update_ratio,
        "dead_rows": ps.dead_rows,
        "nonfinite_weight": not w_ok,
        "nonfinite_grad": not g_ok,
    }


def _columns(rows: list[dict[str, Any] | None]) -> dict[str, list[Any]]:
    keys: list[str] = []
    for r in rows:
        if r:
            keys.extend(k for k in r if k not in keys)
    return {k: [_round(r.get(k)) if r else None for r in rows] for k in keys}


def ema_columns(cols: dict[str, list[Any]], alpha: float) -> dict[str, list[Any]]:
    out = {}
    for k, values in cols.items():
        if k not in EMA_STATS and k != "update_ratio":
            continue
        state = None
        col = []
        for v in values:
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                state = float(v) if state is None else alpha * state + (1 - alpha) * float(v)
                col.append(_round(state))
            else:
                col.append(None)
        out[k] = col
    return out


def _aggregate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-type aggregate of per-module statistics: mean over modules, except min (min), max and
    input_max (max) and counts (sum)."""
    out: dict[str, Any] = {}
    keys = {k for r in rows for k in r}
    for k in keys:
        vals = [r[k] for r in rows if isinstance(r.get(k), (int, float)) and not isinstance(r.get(k), bool)]
        if not vals:
            out[k] = None
        elif k == "min":
            out[k] = min(vals)
        elif k in ("max", "input_max"):
            out[k] = max(vals)
        elif k in _SUM_STATS:
            out[k] = sum(vals)
        else:
            out[k] = statistics.fmean(vals)
    return out


def build_series(run: StatsRun, ema: float = DEFAULT_EMA, nan_origin: NanOrigin | None = None) -> RunSeries:
    """The stored series of a run (``nan_origin``: where a rerun found NaN/Inf born)."""
    steps = [r.step for r in run.records]
    names = list(run.order)
    for r in run.records:
        names.extend(n for n in r.modules if n not in names)
    modules: dict[str, ModuleColumns] = {}
    per_step_act: list[dict[str, dict[str, Any]]] = [{} for _ in run.records]
    per_step_grad: list[dict[str, dict[str, Any]]] = [{} for _ in run.records]
    for idx, name in enumerate(names):
        acts, grads, soft, sources = [], [], [], []
        for i, r in enumerate(run.records):
            ms = r.modules.get(name)
            a = activation_stats(ms) if ms is not None else None
            g = S.finalize(ms.grad) if (ms is not None and ms.grad is not None) else None
            acts.append(a)
            grads.append(g)
            soft.append(SM.finalize(ms.softmax) if ms is not None and ms.softmax is not None else None)
            sources += [src for src in (ms.softmax_sources if ms is not None else []) if src not in sources]
            if a:
                per_step_act[i][name] = a
            if g:
                per_step_grad[i][name] = g
        act_cols, grad_cols = _columns(acts), _columns(grads)
        modules[name] = ModuleColumns(
            type=run.types.get(name, ""), class_path=run.class_paths.get(name, ""), index=idx,
            activation=act_cols, activation_ema=ema_columns(act_cols, ema),
            gradient=grad_cols, gradient_ema=ema_columns(grad_cols, ema),
            softmax=_columns(soft) if any(soft) else {}, softmax_source=sources,
        )
    params: dict[str, ParamColumns] = {}
    pnames: list[str] = []
    for r in run.records:
        pnames.extend(p for p in r.params if p not in pnames)
    per_step_upd: list[dict[str, float]] = [{} for _ in run.records]
    for pname in pnames:
        cols: dict[str, list[Any]] = {k: [] for k in PARAM_COLUMNS}
        owner = ""
        trainable = True
        for i, r in enumerate(run.records):
            ps = r.params.get(pname)
            row = param_stats(ps) if ps is not None else {}
            if ps is not None:
                owner = ps.module
                trainable = trainable and ps.requires_grad
                if ps.update_ratio is not None:
                    per_step_upd[i][pname] = ps.update_ratio
            for k in cols:
                cols[k].append(_round(row.get(k)))
        params[pname] = ParamColumns(
            module=owner, shape=run.param_shapes.get(pname, []), requires_grad=trainable, **cols,
            update_ratio_ema=ema_columns({"update_ratio": cols["update_ratio"]}, ema)["update_ratio"],
        )
    types: dict[str, TypeColumns] = {}
    for name in names:
        t = run.types.get(name, "")
        if t:
            types.setdefault(t, TypeColumns()).modules.append(name)
    param_type = {p: run.types.get(params[p].module, "") for p in params}
    for t, info in types.items():
        members = set(info.modules)
        act_rows, grad_rows, upd = [], [], []
        for i in range(len(run.records)):
            act_rows.append(_aggregate([v for k, v in per_step_act[i].items() if k in members]) or None)
            grad_rows.append(_aggregate([v for k, v in per_step_grad[i].items() if k in members]) or None)
            u = [v for p, v in per_step_upd[i].items() if param_type.get(p) == t]
            upd.append(_round(statistics.fmean(u)) if u else None)
        info.activation = _columns(act_rows)
        info.gradient = _columns(grad_rows)
        info.update_ratio = upd
    nonfinite = [
        NonfiniteEvent(step=r.step, calls=[NonfiniteCall(module=m, input_nonfinite=bad) for m, bad in r.nonfinite],
                       grads=list(r.nonfinite_grads))
        for r in run.records if r.nonfinite or r.nonfinite_grads
    ]
    return RunSeries(
        steps=steps, every=run.every, steps_seen=run.steps_seen, step_on=run.step_on, ema_alpha=ema,
        sample=run.sample, order=names, order_source=run.order_source, modules=modules, params=params, types=types,
        nonfinite=nonfinite, nan_origin=nan_origin, notes=list(run.notes), definitions=dict(S.DEFINITIONS),
    )


def last_finite_index(series: RunSeries) -> int:
    """Index of the last sampled step where no module output or gradient held NaN/Inf (the state to
    show in depth and per-type views); the last step when every step held some."""
    steps = series.steps
    bad = {ev.step for ev in series.nonfinite}
    return next((i for i in range(len(steps) - 1, -1, -1) if steps[i] not in bad), len(steps) - 1)


def nonfinite_counts(series: RunSeries) -> dict[str, list[int]]:
    """Per sampled step: how many module calls produced NaN/Inf outputs (``outputs``), how many
    modules got NaN/Inf gradients (``gradients``) and how many parameters held NaN/Inf before the
    optimizer step (``parameters``)."""
    by_step = {ev.step: ev for ev in series.nonfinite}
    params = series.params.values()
    return {
        "outputs": [len(by_step[s].calls) if s in by_step else 0 for s in series.steps],
        "gradients": [len(by_step[s].grads) if s in by_step else 0 for s in series.steps],
        "parameters": [sum(1 for p in params if cell(p.nonfinite_weight, i)) for i in range(len(series.steps))],
    }
