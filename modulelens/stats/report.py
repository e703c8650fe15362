"""The report: one PNG (matplotlib, Agg backend) and a self-contained HTML page.

For a training run the PNG has three rows: per-module series over the sampled steps (activation
std, zero fraction, gradient std, update-to-weight ratio; one line per module, coloured by
execution order), the depth profile (modules in execution order, findings marked) and per-type
aggregates at the last sampled step where values are finite (said in the titles when later steps held
NaN/Inf), and a fourth row with NaN/Inf counts over the steps. For a capture it has bars per stored tensor. The HTML page embeds
the PNG as a data URI and adds the findings and tables, so it can be mailed or attached as is.

Without matplotlib the HTML page still has every table, and says how to get the plots
(``pip install 'modulelens[plots]'``).
"""

from __future__ import annotations

import base64
import html
import io
import math
from pathlib import Path
from typing import Any

from modulelens.stats.series import last_finite_index, nonfinite_counts

PLOTS_HINT = "plots need matplotlib: pip install 'modulelens[plots]' (or pip install matplotlib)"


def have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _pos(values: list[Any]) -> list[float]:
    return [v if isinstance(v, (int, float)) and v is not None and v > 0 else math.nan for v in values]


def _num(values: list[Any]) -> list[float]:
    return [v if isinstance(v, (int, float)) and v is not None else math.nan for v in values]


def _has_positive(values: list[float]) -> bool:
    return any(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in values)


def _module_update_ratio(series: dict[str, Any], name: str) -> list[Any]:
    """Update ratio of a module across steps: sqrt(sum ||dw||^2 / sum ||w||^2) is not stored, so the
    mean of its parameters' ratios."""
    cols = [p["update_ratio"] for p in series.get("params", {}).values() if p["module"] == name]
    out = []
    for i in range(len(series["steps"])):
        vals = [c[i] for c in cols if c[i] is not None]
        out.append(sum(vals) / len(vals) if vals else None)
    return out


# --------------------------------------------------------------------------------------------
# Training-run figure
# --------------------------------------------------------------------------------------------


def run_figure_png(series: dict[str, Any], findings: list[dict[str, Any]]) -> bytes:
    plt = _pyplot()
    from matplotlib import cm
    from matplotlib.colors import Normalize

    order = series["order"]
    steps = series["steps"]
    mods = series["modules"]
    n = max(len(order), 1)
    cmap = cm.get_cmap("viridis") if hasattr(cm, "get_cmap") else plt.get_cmap("viridis")
    norm = Normalize(0, max(n - 1, 1))
    fig = plt.figure(figsize=(18, 16), layout="constrained")
    grid = fig.add_gridspec(4, 4, height_ratios=[1, 1, 1, 0.6])
    axes = [[fig.add_subplot(grid[r, c]) for c in range(4)] for r in range(3)]
    fig.suptitle(f"modulelens statistics: {len(order)} modules, sampled steps {steps[0] if steps else '-'}"
                 f"..{steps[-1] if steps else '-'} (every {series.get('every')})", fontsize=14)
    flagged = {f["module"] for f in findings}

    # Row 1: series over steps.
    row = [
        ("activation std", "activation", "std", True),
        ("activation zero fraction", "activation", "zero_frac", False),
        ("gradient std (w.r.t. module output)", "gradient", "std", True),
        ("update / weight ratio", None, "update_ratio", True),
    ]
    for ax, (title, kind, stat, log) in zip(axes[0], row):
        drawn = False
        plotted: list[float] = []
        for idx, name in enumerate(order):
            ys = _module_update_ratio(series, name) if kind is None else mods[name].get(kind, {}).get(stat)
            if not ys or all(v is None for v in ys):
                continue
            vals = _pos(ys) if log else _num(ys)
            plotted += vals
            ax.plot(steps, vals, color=cmap(norm(idx)), lw=2.2 if name in flagged else 1.0,
                    marker="o" if len(steps) < 12 else None, ms=3, label=name or "(model)")
            drawn = True
        ax.set_title(title)
        ax.set_xlabel("step")
        if log and _has_positive(plotted):
            ax.set_yscale("log")
        if not drawn:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        if drawn and len(order) <= 10:
            ax.legend(fontsize=7)
    sm = cm.ScalarMappable(norm=norm, cmap=cmap)
    sm.set_array([])
    fig.colorbar(sm, ax=axes[0], fraction=0.02, pad=0.01, label="execution order")

    # Rows 2 and 3: depth profile and per-type aggregates at the last step with finite values.
    last = last_finite_index(series)
    at_step = _step_label(series, last)
    xs = list(range(len(order)))

    def col(name: str, kind: str, stat: str) -> Any:
        c = mods[name].get(kind, {}).get(stat)
        return c[last] if c and last < len(c) else None

    profile = [
        ("activation std / rms by depth", [("std", "activation", "std"), ("rms", "activation", "rms")], True),
        ("gradient std by depth", [("grad std", "gradient", "std")], True),
        ("zero / saturated fraction by depth", [("zero", "activation", "zero_frac"), ("saturated", "activation", "sat_frac")], False),
        ("shape by depth", [("kurtosis", "activation", "kurtosis"), ("skew", "activation", "skew"),
                            ("KL to N(0,1)", "activation", "kl_gauss")], False),
    ]
    for ax, (title, lines, log) in zip(axes[1], profile):
        plotted = []
        for label, kind, stat in lines:
            ys = [col(nm, kind, stat) for nm in order]
            if all(v is None for v in ys):
                continue
            vals = _pos(ys) if log else _num(ys)
            plotted += vals
            ax.plot(xs, vals, marker=".", lw=1, label=label)
        for f in findings:
            if f["module"] in order:
                x = order.index(f["module"])
                ax.axvline(x, color="red", alpha=0.35, lw=2)
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

    # Row 3: per-type aggregates at the last step.
    types = series.get("types", {})
    tnames = sorted(types)

    def tval(t: str, kind: str, stat: str) -> float:
        c = types[t].get(kind, {}).get(stat) if kind else types[t].get("update_ratio")
        v = c[last] if c and last < len(c) else None
        return v if isinstance(v, (int, float)) else math.nan

    bars = [
        ("mean activation std by type", "activation", "std", True),
        ("mean zero fraction by type", "activation", "zero_frac", False),
        ("mean gradient std by type", "gradient", "std", True),
        ("mean update ratio by type", None, "update_ratio", True),
    ]
    for ax, (title, kind, stat, log) in zip(axes[2], bars):
        vals = [tval(t, kind, stat) for t in tnames]
        ax.bar(range(len(tnames)), [v if not (log and not v > 0) else math.nan for v in vals], color="#4c72b0")
        ax.set_xticks(range(len(tnames)))
        ax.set_xticklabels([f"{t} ({len(types[t]['modules'])})" for t in tnames], rotation=45, ha="right", fontsize=8)
        ax.set_title(f"{title}\n({at_step})", fontsize=10)
        if log and _has_positive(vals):
            ax.set_yscale("log")

    # Row 4: NaN/Inf over the sampled steps.
    ax = fig.add_subplot(grid[3, :])
    for label, counts in nonfinite_counts(series).items():
        ax.plot(steps, counts, marker="o" if len(steps) < 40 else None, ms=3, label=label)
    ax.set_title("NaN/Inf over steps: module calls with NaN/Inf outputs, modules with NaN/Inf gradients, "
                 "parameters holding NaN/Inf")
    ax.set_xlabel("step")
    ax.legend(fontsize=8)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return buf.getvalue()


# --------------------------------------------------------------------------------------------
# Capture figure
# --------------------------------------------------------------------------------------------


def capture_figure_png(series: dict[str, Any], findings: list[dict[str, Any]]) -> bytes:
    plt = _pyplot()
    tensors = series["tensors"]
    keys = list(tensors)
    colors = {"input": "#4c72b0", "output": "#dd8452", "weight": "#55a868", "gradient": "#c44e52"}
    fig, axes = plt.subplots(1, 4, figsize=(18, 5.5), layout="constrained")
    fig.suptitle(f"modulelens statistics of capture {series.get('capture')} ({series.get('module_path') or 'root'})")
    panels = [("rms", True), ("std", True), ("zero_frac", False), ("kurtosis", False)]
    for ax, (stat, log) in zip(axes, panels):
        vals = [(tensors[k]["stats"] or {}).get(stat) for k in keys]
        vals = _pos(vals) if log else _num(vals)
        ax.bar(range(len(keys)), vals, color=[colors.get(tensors[k]["group"], "gray") for k in keys])
        ax.set_title(stat)
        if log and _has_positive(vals):
            ax.set_yscale("log")
        if len(keys) <= 60:
            ax.set_xticks(range(len(keys)))
            ax.set_xticklabels(keys, rotation=90, fontsize=6)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return buf.getvalue()


# --------------------------------------------------------------------------------------------
# HTML
# --------------------------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;max-width:1500px}
h1{font-size:22px} h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:12px} td,th{border:1px solid #ddd;padding:3px 6px;text-align:right}
th{background:#f3f3f3} td.l,th.l{text-align:left} tr.flag td{background:#fff1f0}
.f{border-left:5px solid #d9534f;background:#fdf7f7;padding:8px 12px;margin:10px 0}
.f.warning{border-color:#f0ad4e;background:#fffaf2} .k{font-weight:bold} .a{color:#2b5d8a}
.note{color:#666;font-size:13px} img{max-width:100%;border:1px solid #eee}
"""


def _cell(v: Any) -> str:
    if v is None:
        return "<td>-</td>"
    if isinstance(v, bool):
        return f"<td>{'yes' if v else ''}</td>"
    if isinstance(v, float):
        return f"<td>{v:.4g}</td>"
    if isinstance(v, int):
        return f"<td>{v}</td>"
    return f'<td class="l">{html.escape(str(v))}</td>'


def _held_text(f: dict[str, Any]) -> str:
    """``step 10``, or ``steps 0-10 (held on 5 sampled steps)`` for a finding judged on several steps."""
    first, last, count = f.get("first_step"), f.get("last_step"), f.get("steps_held", 1)
    if first is None or first == last:
        return f"step {f.get('step')}"
    return f"steps {first}-{last} (held on {count} sampled steps)"


def _findings_html(findings: list[dict[str, Any]]) -> str:
    if not findings:
        return "<p>No findings: nothing looks dead, exploding, vanishing, saturated or non-finite.</p>"
    parts = []
    for f in findings:
        ev = ", ".join(f"{k}={v}" for k, v in f.get("evidence", {}).items())
        parts.append(
            f'<div class="f {html.escape(f.get("severity", "error"))}"><span class="k">{html.escape(f["kind"])}</span> '
            f"at <code>{html.escape(f['module'] or '(model)')}</code>, {_held_text(f)}<br>"
            f"{html.escape(f['message'])}<br><span class=\"a\">Action: {html.escape(f['action'])}</span><br>"
            f'<span class="note">{html.escape(ev)}</span></div>'
        )
    return "\n".join(parts)


def _page(title: str, head: list[tuple[str, Any]], notes: list[str], findings: list[dict[str, Any]],
          png: bytes | None, tables: list[tuple[str, str]]) -> str:
    rows = "".join(f'<tr><th class="l">{html.escape(k)}</th>{_cell(v)}</tr>' for k, v in head)
    note_html = "".join(f'<p class="note">{html.escape(n)}</p>' for n in notes)
    img = (f'<img alt="plots" src="data:image/png;base64,{base64.b64encode(png).decode()}">' if png
           else f'<p class="note">{html.escape(PLOTS_HINT)}</p>')
    body = "".join(f"<h2>{html.escape(t)}</h2>{tbl}" for t, tbl in tables)
    return (
        f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
        f"<style>{_CSS}</style></head><body><h1>{html.escape(title)}</h1><table>{rows}</table>{note_html}"
        f"<h2>Findings</h2>{_findings_html(findings)}<h2>Plots</h2>{img}{body}</body></html>"
    )


_MODULE_COLS = [
    ("act mean", "activation", "mean"), ("act std", "activation", "std"), ("skew", "activation", "skew"),
    ("kurtosis", "activation", "kurtosis"), ("zero", "activation", "zero_frac"), ("min", "activation", "min"),
    ("max", "activation", "max"), ("NaN", "activation", "nan"), ("Inf", "activation", "inf"),
    ("KL", "activation", "kl_gauss"), ("gain", "activation", "gain"), ("sat", "activation", "sat_frac"),
    ("grad std", "gradient", "std"), ("grad NaN", "gradient", "nan"),
]


def _step_label(series: dict[str, Any], i: int) -> str:
    """``step N``, saying when it is not the last sampled step (later steps held NaN/Inf)."""
    steps = series["steps"]
    if not steps:
        return "step -"
    if i == len(steps) - 1:
        return f"step {steps[i]}"
    return f"step {steps[i]}, the last with finite values"


def _nonfinite_table(series: dict[str, Any]) -> str:
    counts = nonfinite_counts(series)
    first = {ev["step"]: ev for ev in series.get("nonfinite", [])}
    rows = []
    for i, step in enumerate(series["steps"]):
        ev = first.get(step)
        origin = next((c["module"] for c in ev["calls"] if not c["input_nonfinite"]), None) if ev else None
        rows.append(f"<tr><td>{step}</td>" + "".join(_cell(counts[k][i]) for k in ("outputs", "gradients", "parameters"))
                    + f'<td class="l">{html.escape(origin if origin is not None else "-") or "(model)"}</td></tr>')
    return ('<table><tr><th>step</th><th>calls with NaN/Inf outputs</th><th>modules with NaN/Inf gradients</th>'
            '<th>parameters holding NaN/Inf</th><th class="l">first module producing them</th></tr>'
            + "".join(rows) + "</table>")


def run_html(series: dict[str, Any], findings: list[dict[str, Any]], png: bytes | None, meta: dict[str, Any]) -> str:
    steps = series["steps"]
    last = last_finite_index(series)
    flagged = {f["module"] for f in findings}
    head = "".join(f"<th>{html.escape(c)}</th>" for c, _, _ in _MODULE_COLS)
    rows = []
    for idx, name in enumerate(series["order"]):
        m = series["modules"][name]
        cells = []
        for _, kind, stat in _MODULE_COLS:
            c = m.get(kind, {}).get(stat)
            cells.append(_cell(c[last] if c and last < len(c) else None))
        upd = _module_update_ratio(series, name)
        cells.append(_cell(upd[last] if upd else None))
        cls = ' class="flag"' if name in flagged else ""
        rows.append(f'<tr{cls}><td>{idx}</td><td class="l">{html.escape(name or "(model)")}</td>'
                    f'<td class="l">{html.escape(m["type"])}</td>{"".join(cells)}</tr>')
    modules_tbl = (f'<table><tr><th>#</th><th class="l">module</th><th class="l">type</th>{head}<th>update ratio</th></tr>'
                   + "".join(rows) + "</table>")
    trows = []
    for t, info in sorted(series.get("types", {}).items()):
        def tv(kind: str, stat: str, info=info) -> Any:
            c = info.get(kind, {}).get(stat)
            return c[last] if c and last < len(c) else None
        u = info.get("update_ratio") or []
        trows.append(f'<tr><td class="l">{html.escape(t)}</td><td>{len(info["modules"])}</td>'
                     + "".join(_cell(tv(k, s)) for k, s in [("activation", "std"), ("activation", "zero_frac"),
                                                            ("activation", "kurtosis"), ("activation", "nan"),
                                                            ("gradient", "std")])
                     + _cell(u[last] if u and last < len(u) else None) + "</tr>")
    types_tbl = ('<table><tr><th class="l">type</th><th>modules</th><th>mean act std</th><th>mean zero</th>'
                 "<th>mean kurtosis</th><th>NaN</th><th>mean grad std</th><th>mean update ratio</th></tr>"
                 + "".join(trows) + "</table>")
    defs = "".join(f'<tr><td class="l">{html.escape(k)}</td><td class="l">{html.escape(v)}</td></tr>'
                   for k, v in series.get("definitions", {}).items())
    head_rows = [
        ("run", meta.get("ref")), ("script", meta.get("script")), ("modules", len(series["order"])),
        ("optimizer steps seen", series.get("steps_seen")), ("sampled steps", len(steps)),
        ("every", series.get("every")), ("execution order from", series.get("order_source")),
        ("EMA alpha", series.get("ema_alpha")),
    ]
    return _page(
        f"modulelens statistics: {meta.get('ref', '')}", head_rows, series.get("notes", []), findings, png,
        [(f"Modules at {_step_label(series, last)} (execution order)", modules_tbl),
         (f"By module type at {_step_label(series, last)}", types_tbl),
         ("NaN/Inf over steps", _nonfinite_table(series)), ("Definitions", f"<table>{defs}</table>")],
    )


def capture_html(series: dict[str, Any], findings: list[dict[str, Any]], png: bytes | None, meta: dict[str, Any]) -> str:
    stats_cols = ["mean", "std", "skew", "kurtosis", "zero_frac", "min", "max", "nan", "inf", "kl_gauss", "rms"]
    head = "".join(f"<th>{c}</th>" for c in stats_cols)
    rows = []
    for key, t in series["tensors"].items():
        s = t["stats"] or {}
        rows.append(f'<tr><td class="l">{html.escape(key)}</td><td class="l">{t["group"]}</td>'
                    f'<td class="l">{html.escape(str(t["shape"]))}</td><td class="l">{t["dtype"]}</td>'
                    f'{_cell(t["stored"])}' + "".join(_cell(s.get(c)) for c in stats_cols) + "</tr>")
    tbl = (f'<table><tr><th class="l">tensor</th><th class="l">group</th><th class="l">shape</th><th class="l">dtype</th>'
           f"<th>stored</th>{head}</tr>" + "".join(rows) + "</table>")
    head_rows = [("run", meta.get("ref")), ("capture", series.get("capture")), ("module", series.get("module_path")),
                 ("class", series.get("class_path")), ("tensors", len(series["tensors"]))]
    return _page(f"modulelens statistics: capture {series.get('capture')}", head_rows, series.get("notes", []),
                 findings, png, [("Tensors", tbl)])


def write_report(folder: Path, series: dict[str, Any], findings: list[dict[str, Any]], meta: dict[str, Any],
                 plots: bool = True) -> tuple[list[str], list[str]]:
    """Write ``report.png`` (when matplotlib is there) and ``report.html`` into ``folder``.
    Returns (files written, notes)."""
    notes: list[str] = []
    png: bytes | None = None
    capture = series.get("source") == "capture"
    if plots:
        if have_matplotlib():
            try:
                png = capture_figure_png(series, findings) if capture else run_figure_png(series, findings)
            except Exception as e:  # noqa: BLE001 - a plotting failure must not lose the statistics
                notes.append(f"plotting failed ({type(e).__name__}: {e}); the HTML report has the tables only")
        else:
            notes.append(PLOTS_HINT)
    files = []
    if png is not None:
        (folder / "report.png").write_bytes(png)
        files.append("report.png")
    page = (capture_html if capture else run_html)(series, findings, png, meta)
    (folder / "report.html").write_text(page, encoding="utf-8")
    files.append("report.html")
    return files, notes
