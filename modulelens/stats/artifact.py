"""Store statistics in the repository as ``stats`` artifacts, and compute them over captures.

Files of a ``stats`` version::

    manifest.json    source, summary (modules, steps, order source, findings count, notes)
    series.json      per-module raw and EMA series (see :mod:`modulelens.stats.series`), or for a
                     capture the statistics of each stored tensor
    findings.json    the findings (see :mod:`modulelens.stats.findings`)
    report.html      self-contained report (PNG embedded)
    report.png       the plots (when matplotlib is installed)
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from modulelens.repo import Artifact, Repository, validate_name
from modulelens.stats import stats as S
from modulelens.stats.findings import evaluate
from modulelens.stats.judging import DEFAULT_THRESHOLDS, finding
from modulelens.stats.manifest import KIND, StatsManifest, StatsSource, StatsSummary, TypeRow
from modulelens.stats.records import StatsRun
from modulelens.stats.report import write_report
from modulelens.stats.schema import CaptureSeries, NanOrigin, RunSeries, StatsFinding, TensorEntry, cell, dump
from modulelens.stats.series import DEFAULT_EMA, build_series, last_finite_index


def default_stats_name(script: Path | None) -> str:
    base = script.stem if script is not None else "stats"
    base = "".join(c if (c.isalnum() or c in "_.-") else "-" for c in base).strip(".-") or "stats"
    return validate_name(base[:100])


def _store(repo: Repository, name: str, series: RunSeries | CaptureSeries, found: list[StatsFinding],
           source: StatsSource, summary: StatsSummary, plots: bool) -> Artifact:
    def write(folder: Path) -> StatsManifest:
        (folder / "series.json").write_text(dump(series))
        (folder / "findings.json").write_text(dump(found))  # type: ignore[arg-type]
        files, notes = write_report(folder, series, found, {"ref": name, "script": source.script}, plots)
        done = summary.model_copy(update={"notes": [*summary.notes, *notes], "report_files": files})
        return StatsManifest(source=source, summary=done)

    return repo.create(KIND, validate_name(name), write)


def save_run(repo: Repository, name: str, run: StatsRun, *, ema: float = DEFAULT_EMA, plots: bool = True,
             thresholds: dict[str, float] | None = None, source: dict[str, Any] | None = None,
             nan_origin: NanOrigin | None = None) -> tuple[Artifact, list[StatsFinding]]:
    """Store a run: its series, findings and report (``nan_origin``: where a rerun found NaN/Inf born)."""
    series = build_series(run, ema, nan_origin)
    found = evaluate(series, thresholds)
    summary = StatsSummary(
        kind="run", modules=len(series.order), steps_seen=run.steps_seen, steps_sampled=len(series.steps),
        sampled_steps=series.steps[:50], every=run.every, order_source=run.order_source,  # type: ignore[arg-type]
        findings=len(found), compiled=run.compiled, notes=list(run.notes), by_type=type_summary(series),
        by_type_step=series.steps[last_finite_index(series)] if series.steps else None,
    )
    art = _store(repo, name, series, found, StatsSource.model_validate(source or {}), summary, plots)
    return art, found


def type_summary(series: RunSeries) -> list[TypeRow]:
    """Per-type aggregates at the last sampled step with finite values (small: one row per type)."""
    out = []
    last = last_finite_index(series)
    for t, info in sorted(series.types.items()):
        act, grad = info.activation, info.gradient
        out.append(TypeRow(
            type=t, modules=len(info.modules),
            activation_std=cell(act.get("std"), last), activation_zero_frac=cell(act.get("zero_frac"), last),
            activation_kurtosis=cell(act.get("kurtosis"), last), gradient_std=cell(grad.get("std"), last),
            update_ratio=cell(info.update_ratio, last),
            nonfinite=(cell(act.get("nan"), last) or 0) + (cell(act.get("inf"), last) or 0),
        ))
    return out


# --------------------------------------------------------------------------------------------
# Statistics over a capture
# --------------------------------------------------------------------------------------------


def capture_series(capture: Artifact) -> CaptureSeries:
    """Statistics of every tensor a capture holds: inputs, outputs, weights (and gradients when
    captured). Shape-only tensors get the summary kept in the manifest (mean, std, min, max, zero
    fraction): their other statistics are None and ``stored`` is False."""
    from modulelens.capture import TensorSpec, capture_manifest, load_tensors

    m = capture_manifest(capture)
    tensors: dict[str, TensorEntry] = {}
    notes: list[str] = []

    def add(group: str, spec: TensorSpec, data: dict[str, Any]) -> None:
        key = spec.key
        t = data.get(key)
        if t is not None:
            st = S.tensor_stats(t)
        else:
            summ = spec.stats
            st = {k: None for k in S.STAT_NAMES}
            if summ is not None:
                st.update(mean=summ.mean, std=summ.std, min=summ.min, max=summ.max, zero_frac=summ.zero_fraction)
            if st["mean"] is not None and st["std"] is not None:
                st["rms"] = math.sqrt(st["mean"] ** 2 + st["std"] ** 2)
        tensors[key] = TensorEntry(group=group, shape=spec.shape, dtype=spec.dtype, stored=t is not None,  # type: ignore[arg-type]
                                   stats=_clean(st))

    inputs = load_tensors(capture, "inputs.safetensors")
    for spec in m.inputs.tensor_leaves():
        add("input", spec, inputs)
    outputs = load_tensors(capture, "outputs.safetensors")
    for spec in m.output_leaves():
        add("output", spec, outputs)
    weights = load_tensors(capture, "weights.safetensors")
    for spec in m.weight_specs().values():
        add("weight", spec, weights)
    grads = load_tensors(capture, "grads.safetensors")
    for key, t in grads.items():
        tensors[f"grad.{key}"] = TensorEntry(group="gradient", shape=list(t.shape), dtype=str(t.dtype).replace("torch.", ""),
                                             stored=True, stats=_clean(S.tensor_stats(t)))
    shape_only = [k for k, t in tensors.items() if not t.stored]
    if shape_only:
        notes.append(f"{len(shape_only)} tensor(s) were stored shape-only; their statistics come from the "
                     f"capture's summary (mean, std, min, max, zero fraction): {', '.join(shape_only[:5])}")
    return CaptureSeries(capture=capture.ref, module_path=m.module_path or "", class_path=m.class_path or "",
                         tensors=tensors, notes=notes, definitions=dict(S.DEFINITIONS))


def _clean(d: dict[str, Any]) -> dict[str, Any]:
    return {k: (float(f"{v:.7g}") if isinstance(v, float) and math.isfinite(v) else (None if isinstance(v, float) else v))
            for k, v in d.items()}


def _rms_of(tensors: dict[str, TensorEntry], group: str) -> float | None:
    sq, n = 0.0, 0
    for t in tensors.values():
        rms = t.stats.get("rms")
        if t.group != group or not isinstance(rms, (int, float)) or not t.shape:
            continue
        k = math.prod(t.shape)
        sq += rms**2 * k
        n += k
    return math.sqrt(sq / n) if n else None


def capture_findings(series: CaptureSeries, thresholds: dict[str, float] | None = None) -> list[StatsFinding]:
    """Findings over one captured call: NaN/Inf (in the inputs, the weights, or produced by the
    module), a dead output, and an exploding or vanishing gain from inputs to outputs."""
    th = {**DEFAULT_THRESHOLDS, **(thresholds or {})}
    tensors = series.tensors
    module = series.module_path
    out: list[StatsFinding] = []

    def bad(group: str) -> list[str]:
        return [k for k, t in tensors.items() if t.group == group and (t.stats.get("nan") or t.stats.get("inf"))]

    bad_in, bad_w, bad_out = bad("input"), bad("weight"), bad("output")
    label = module or "the captured module"
    if bad_out or bad_in or bad_w:
        if bad_in:
            msg = f"the inputs of {label} already hold NaN/Inf ({', '.join(bad_in[:3])}): they come from before this module"
            action, tensor = "capture an earlier module, or check the data pipeline", "input"
        elif bad_w:
            msg = f"the weights of {label} hold NaN/Inf ({', '.join(bad_w[:3])}), so its outputs are non-finite"
            action, tensor = "find the update that wrote them (learning rate, gradient clipping) or reload a good checkpoint", "weight"
        else:
            msg = f"{label} turns finite inputs and weights into NaN/Inf outputs ({', '.join(bad_out[:3])})"
            action, tensor = "look for log/sqrt of non-positive values, division by zero or overflow in its forward", "output"
        out.append(finding("nan_inf", module, 0, "error", msg + ".", action,
                           {"nonfinite_inputs": len(bad_in), "nonfinite_weights": len(bad_w), "nonfinite_outputs": len(bad_out)},
                           phase="forward", tensor=tensor))
        return out
    for k, t in tensors.items():
        zf, mn = t.stats.get("zero_frac"), t.stats.get("min")
        if t.group == "output" and isinstance(zf, (int, float)) and zf >= th["dead_zero_frac"] and (mn is None or mn >= 0):
            out.append(finding("dead_activation", module, 0, "error",
                               f"{label} outputs exactly zero for {zf:.1%} of the values of {k}: its units are dead.",
                               "check the bias/initialisation feeding it, or use LeakyReLU/GELU", {"tensor": k, "zero_frac": zf},
                               based_on=["one captured call: judged by the zero fraction alone"]))
    rin, rout = _rms_of(tensors, "input"), _rms_of(tensors, "output")
    if rin and rout:
        gain = rout / rin
        if gain >= th["explode_gain"] and rout >= th["explode_rms"]:
            out.append(finding("exploding_activation", module, 0, "error",
                               f"{label} multiplies the scale of its inputs by {gain:.3g}x (input rms {rin:.3g}, output rms {rout:.3g}).",
                               "check its weight initialisation scale and any scaling factor in its forward",
                               {"gain": gain, "input_rms": rin, "output_rms": rout}))
        elif 0 < gain <= th["vanish_gain"]:
            out.append(finding("vanishing_activation", module, 0, "warning",
                               f"{label} shrinks the scale of its inputs by {1 / gain:.3g}x (input rms {rin:.3g}, output rms {rout:.3g}).",
                               "check its weight initialisation scale (zero-initialised on purpose? then ignore)",
                               {"gain": gain, "input_rms": rin, "output_rms": rout}))
    return out


def save_capture_stats(repo: Repository, name: str, capture: Artifact, *, plots: bool = True,
                       thresholds: dict[str, float] | None = None) -> tuple[Artifact, CaptureSeries, list[StatsFinding]]:
    series = capture_series(capture)
    found = capture_findings(series, thresholds)
    summary = StatsSummary(
        kind="capture", capture=capture.ref, modules=1, tensors=len(series.tensors), findings=len(found),
        notes=list(series.notes),
    )
    art = _store(repo, name, series, found, StatsSource(kind="capture", capture=capture.ref), summary, plots)
    return art, series, found
