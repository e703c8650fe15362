"""The report's plots: one PNG (matplotlib, Agg backend) per stored run.

A training run's figure has five rows, and every line and marker on it is named in a legend:

1. per-module series over the sampled steps (activation std, zero fraction, gradient std, update
   ratio; one line per module, coloured by execution order; thick lines: modules with a finding);
2. the depth profile at the last sampled step with finite values (modules in execution order),
   each finding marked at its module with a symbol per kind, the NaN/Inf origin with a black cross;
3. per-type aggregates at that step;
4. saturation over steps: the saturated fraction of tanh/sigmoid/hardtanh outputs and, for modules
   that compute a softmax (attention weights included), the normalised entropy, the fraction of
   one-hot rows and the mean largest probability, with the rules' thresholds drawn dashed;
5. NaN/Inf counts over the steps, with the step where NaN/Inf was born (from a rerun) and the first
   sampled step that held them marked.

Where a NaN/Inf origin is known, rows 1 and 5 mark its step with a vertical line. A capture's figure
has bars per stored tensor.
"""

from __future__ import annotations

import io
import math
from typing import Any

from modulelens.stats.judging import DEFAULT_THRESHOLDS
from modulelens.stats.schema import CaptureSeries, RunSeries, StatsFinding, cell
from modulelens.stats.series import last_finite_index, nonfinite_counts

KIND_MARKERS = {
    "dead_activation": ("v", "#d62728"), "exploding_activation": ("^", "#d62728"),
    "vanishing_activation": ("v", "#ff7f0e"), "exploding_gradient": ("^", "#9467bd"),
    "vanishing_gradient": ("v", "#9467bd"), "saturation": ("s", "#ff7f0e"), "softmax_saturation": ("D", "#ff7f0e"),
    "nan_inf": ("X", "black"), "nan_inf_gradient": ("X", "#8c564b"),
}
ORIGIN_STYLE = {"color": "black", "ls": "--", "lw": 1.5}
FIRST_SEEN_STYLE = {"color": "grey", "ls": ":", "lw": 1.5}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _pos(values: list[Any]) -> list[float]:
    return [v if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 else math.nan for v in values]


def _num(values: list[Any]) -> list[float]:
    return [v if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan for v in values]


def _has_positive(values: list[float]) -> bool:
    return any(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in values)


def module_update_ratio(series: RunSeries, name: str) -> list[float | None]:
    """Update ratio of a module across steps: the mean of its parameters' ratios."""
    cols = [p.update_ratio for p in series.params.values() if p.module == name]
    out: list[float | None] = []
    for i in range(len(series.steps)):
        vals = [v for v in (cell(c, i) for c in cols) if isinstance(v, (int, float))]
        out.append(sum(vals) / len(vals) if vals else None)
    return out


def _nan_marks(series: RunSeries, ax: Any) -> None:
    """Vertical lines at the step where NaN/Inf was born (rerun) and the first sampled step with them."""
    o = series.nan_origin
    if o is not None and o.found and o.step is not None:
        ax.axvline(o.step, **ORIGIN_STYLE, label=f"NaN/Inf born (rerun): step {o.step}, {o.module or 'root'}, {o.phase}")
    if series.nonfinite:
        ax.axvline(series.nonfinite[0].step, **FIRST_SEEN_STYLE, label=f"first sampled step with NaN/Inf: "
                   f"{series.nonfinite[0].step}")


def run_figure_png(series: RunSeries, findings: list[StatsFinding]) -> bytes:
    """The training run's figure as PNG bytes."""
    plt = _pyplot()
    fig = run_figure(series, findings)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    return buf.getvalue()


def run_figure(series: RunSeries, findings: list[StatsFinding]) -> Any:
    """The training run's matplotlib figure (see the module docstring); close it when done."""
    plt = _pyplot()
    from matplotlib import cm
    from matplotlib.colors import Normalize
    from matplotlib.lines import Line2D

    order, steps, mods = series.order, series.steps, series.modules
    n = max(len(order), 1)
    cmap = cm.get_cmap("viridis") if hasattr(cm, "get_cmap") else plt.get_cmap("viridis")
    norm = Normalize(0, max(n - 1, 1))
    fig = plt.figure(figsize=(18, 20), layout="constrained")
    grid = fig.add_gridspec(5, 4, height_ratios=[1, 1, 1, 0.9, 0.6])
    axes = [[fig.add_subplot(grid[r, c]) for c in range(4)] for r in range(4)]
    fig.suptitle(f"modulelens statistics: {len(order)} modules, sampled steps {steps[0] if steps else '-'}"
                 f"..{steps[-1] if steps else '-'} (every {series.every})", fontsize=14)
    flagged = {f.module for f in findings}
    marks = [Line2D([], [], color="grey", lw=2.6, label="thick line: a module with a finding")] if flagged else []

    # Row 1: series over steps.
    row = [("activation std", "activation", "std", True), ("activation zero fraction", "activation", "zero_frac", False),
           ("gradient std (w.r.t. module output)", "gradient", "std", True), ("update / weight ratio", None, "update_ratio", True)]
    for ax, (title, kind, stat, log) in zip(axes[0], row):
        plotted: list[float] = []
        for idx, name in enumerate(order):
            ys = module_update_ratio(series, name) if kind is None else getattr(mods[name], kind).get(stat)
            if not ys or all(v is None for v in ys):
                continue
            vals = _pos(ys) if log else _num(ys)
            plotted += vals
            ax.plot(steps, vals, color=cmap(norm(idx)), lw=2.6 if name in flagged else 1.0,
                    marker="o" if len(steps) < 12 else None, ms=3, label=(name or "(model)") if len(order) <= 10 else None)
        _nan_marks(series, ax)
        ax.set_title(title)
        ax.set_xlabel("step")
        if log and _has_positive(plotted):
            ax.set_yscale("log")
        if not plotted:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        handles, _ = ax.get_legend_handles_labels()
        if handles or marks:
            ax.legend(handles=handles + marks, fontsize=7)
    sm = cm.ScalarMappable(norm=norm, cmap=cmap)
    sm.set_array([])
    fig.colorbar(sm, ax=axes[0], fraction=0.02, pad=0.01, label="execution order")

    # Rows 2 and 3: depth profile and per-type aggregates at the last step with finite values.
    last = last_finite_index(series)
    at_step = step_label(series, last)
    xs = list(range(len(order)))
    profile = [
        ("activation std / rms by depth", [("std", "activation", "std"), ("rms", "activation", "rms")], True),
        ("gradient std by depth", [("grad std", "gradient", "std")], True),
        ("zero / saturated fraction by depth", [("zero", "activation", "zero_frac"), ("saturated", "activation", "sat_frac"),
                                                ("softmax one-hot rows", "softmax", "onehot_frac")], False),
        ("shape by depth", [("kurtosis", "activation", "kurtosis"), ("skew", "activation", "skew"),
                            ("KL to N(0,1)", "activation", "kl_gauss")], False),
    ]
    for ax, (title, lines, log) in zip(axes[1], profile):
        plotted = []
        for lab, kind, stat in lines:
            ys = [mods[nm].at(kind, stat, last) for nm in order]
            if all(v is None for v in ys):
                continue
            vals = _pos(ys) if log else _num(ys)
            plotted += vals
            ax.plot(xs, vals, marker=".", lw=1, label=lab)
        _finding_marks(ax, series, findings, plotted, log)
        ax.set_title(f"{title}\n({at_step})", fontsize=10)
        ax.set_xlabel("module (execution order)")
        if log and _has_positive(plotted):
            ax.set_yscale("log")
        elif not log and plotted:
            finite = [abs(v) for v in plotted if not math.isnan(v)]
            if finite and max(finite) > 100:
                ax.set_yscale("symlog", linthresh=1.0)
        stride = max(1, math.ceil(len(order) / 40))
        ax.set_xticks(xs[::stride])
        ax.set_xticklabels([nm or "(model)" for nm in order][::stride], rotation=90, fontsize=6)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    _type_bars(series, axes[2], last, at_step)
    _saturation_row(series, axes[3])

    # Row 5: NaN/Inf over the sampled steps.
    ax = fig.add_subplot(grid[4, :])
    for lab, counts in nonfinite_counts(series).items():
        ax.plot(steps, counts, marker="o" if len(steps) < 40 else None, ms=3, label=lab)
    _nan_marks(series, ax)
    ax.set_title("NaN/Inf over steps: module calls with NaN/Inf outputs, modules with NaN/Inf gradients, "
                 "parameters holding NaN/Inf")
    ax.set_xlabel("step")
    ax.legend(fontsize=8)
    return fig


def _finding_marks(ax: Any, series: RunSeries, findings: list[StatsFinding], plotted: list[float], log: bool) -> None:
    """A marker per finding at its module (one legend entry per kind), the NaN/Inf origin as a cross."""
    order = series.order
    finite = [v for v in plotted if not math.isnan(v) and (v > 0 or not log)]
    y = max(finite) if finite else 1.0
    seen: set[str] = set()
    for f in findings:
        if f.module not in order:
            continue
        marker, colour = KIND_MARKERS.get(f.kind, ("o", "red"))
        ax.axvline(order.index(f.module), color=colour, alpha=0.25, lw=2)
        ax.scatter([order.index(f.module)], [y], marker=marker, color=colour, s=60, zorder=5,
                   label=None if f.kind in seen else f"finding: {f.kind}")
        seen.add(f.kind)
    o = series.nan_origin
    if o is not None and o.found and o.module in order:
        ax.axvline(order.index(o.module), **ORIGIN_STYLE, label=f"NaN/Inf born here (step {o.step}, {o.phase})")


def _type_bars(series: RunSeries, axes: list[Any], last: int, at_step: str) -> None:
    tnames = sorted(series.types)

    def tval(t: str, kind: str | None, stat: str) -> float:
        info = series.types[t]
        v = cell(info.update_ratio if kind is None else getattr(info, kind).get(stat), last)
        return v if isinstance(v, (int, float)) else math.nan

    bars = [("mean activation std by type", "activation", "std", True),
            ("mean zero fraction by type", "activation", "zero_frac", False),
            ("mean gradient std by type", "gradient", "std", True), ("mean update ratio by type", None, "update_ratio", True)]
    for ax, (title, kind, stat, log) in zip(axes, bars):
        vals = [tval(t, kind, stat) for t in tnames]
        ax.bar(range(len(tnames)), [v if not (log and not v > 0) else math.nan for v in vals], color="#4c72b0")
        ax.set_xticks(range(len(tnames)))
        ax.set_xticklabels([f"{t} ({len(series.types[t].modules)})" for t in tnames], rotation=45, ha="right", fontsize=8)
        ax.set_title(f"{title}\n({at_step})", fontsize=10)
        if log and _has_positive(vals):
            ax.set_yscale("log")


def _saturation_row(series: RunSeries, axes: list[Any]) -> None:
    """Saturation and softmax entropy over steps, with the rules' thresholds."""
    th = DEFAULT_THRESHOLDS
    panels = [
        ("saturated fraction (tanh/sigmoid/hardtanh)", "activation", "sat_frac", th["saturation_frac"],
         "saturation finding at"),
        ("softmax entropy / its maximum (1 uniform, 0 one-hot)", "softmax", "entropy", th["softmax_entropy"],
         "softmax_saturation below"),
        ("softmax mean largest probability", "softmax", "max_prob", th["softmax_max_prob"], "softmax_saturation above"),
        ("softmax rows with largest probability >= 0.99", "softmax", "onehot_frac", None, ""),
    ]
    steps = series.steps
    for ax, (title, kind, stat, threshold, what) in zip(axes, panels):
        drawn = 0
        for name in series.order:
            ys = getattr(series.modules[name], kind).get(stat)
            if not ys or all(v is None for v in ys):
                continue
            ax.plot(steps, _num(ys), marker="o" if len(steps) < 12 else None, ms=3, lw=1.2,
                    label=(name or "(model)") if drawn < 8 else None)
            drawn += 1
        if drawn and threshold is not None:
            ax.axhline(threshold, color="red", ls="--", lw=1, label=f"{what} {threshold:g}")
        if not drawn:
            ax.text(0.5, 0.5, "no bounded activation" if kind == "activation" else "no softmax observed",
                    ha="center", va="center", transform=ax.transAxes)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.set_ylim(-0.02, 1.02)
        if drawn:
            ax.legend(fontsize=7)


def step_label(series: RunSeries, i: int) -> str:
    """``step N``, saying when it is not the last sampled step (later steps held NaN/Inf)."""
    steps = series.steps
    if not steps:
        return "step -"
    if i == len(steps) - 1:
        return f"step {steps[i]}"
    return f"step {steps[i]}, the last with finite values"


def capture_figure_png(series: CaptureSeries, findings: list[StatsFinding]) -> bytes:
    plt = _pyplot()
    from matplotlib.patches import Patch

    tensors = series.tensors
    keys = list(tensors)
    colors = {"input": "#4c72b0", "output": "#dd8452", "weight": "#55a868", "gradient": "#c44e52"}
    fig, axes = plt.subplots(1, 4, figsize=(18, 5.5), layout="constrained")
    fig.suptitle(f"modulelens statistics of capture {series.capture} ({series.module_path or 'root'})")
    panels = [("rms", True), ("std", True), ("zero_frac", False), ("kurtosis", False)]
    for ax, (stat, log) in zip(axes, panels):
        raw = [tensors[k].stats.get(stat) for k in keys]
        vals = _pos(raw) if log else _num(raw)
        ax.bar(range(len(keys)), vals, color=[colors.get(tensors[k].group, "gray") for k in keys])
        ax.set_title(stat)
        if log and _has_positive(vals):
            ax.set_yscale("log")
        if len(keys) <= 60:
            ax.set_xticks(range(len(keys)))
            ax.set_xticklabels(keys, rotation=90, fontsize=6)
    axes[0].legend(handles=[Patch(color=c, label=g) for g, c in colors.items()], fontsize=7)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return buf.getvalue()
