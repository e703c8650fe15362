"""The report: ``report.png`` (the plots of :mod:`modulelens.stats.plots`) and a self-contained HTML
page that embeds the PNG as a data URI and adds the findings (with the evidence each action follows
from) and tables, so it can be mailed or attached as is.

Without matplotlib the HTML page still has every table, and says how to get the plots
(``pip install 'modulelens[plots]'``).
"""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any

from modulelens.stats.plots import capture_figure_png, module_update_ratio, run_figure_png, step_label
from modulelens.stats.schema import CaptureSeries, RunSeries, StatsFinding, cell
from modulelens.stats.series import last_finite_index, nonfinite_counts

PLOTS_HINT = "plots need matplotlib: pip install 'modulelens[plots]' (or pip install matplotlib)"


def have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;max-width:1500px}
h1{font-size:22px} h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:12px} td,th{border:1px solid #ddd;padding:3px 6px;text-align:right}
th{background:#f3f3f3} td.l,th.l{text-align:left} tr.flag td{background:#fff1f0}
.f{border-left:5px solid #d9534f;background:#fdf7f7;padding:8px 12px;margin:10px 0}
.f.warning{border-color:#f0ad4e;background:#fffaf2} .k{font-weight:bold} .a{color:#2b5d8a}
.note{color:#666;font-size:13px} img{max-width:100%;border:1px solid #eee} ul.b{margin:4px 0;color:#555;font-size:13px}
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


def _held_text(f: StatsFinding) -> str:
    """``step 10``, or ``steps 0-10 (held on 5 sampled steps)`` for a finding judged on several steps."""
    if f.first_step is None or f.first_step == f.last_step:
        return f"step {f.step}"
    return f"steps {f.first_step}-{f.last_step} (held on {f.steps_held} sampled steps)"


def _findings_html(findings: list[StatsFinding]) -> str:
    if not findings:
        return "<p>No findings: nothing looks dead, exploding, vanishing, saturated or non-finite.</p>"
    parts = []
    for f in findings:
        ev = ", ".join(f"{k}={v}" for k, v in f.evidence.items())
        origin = f" ({f.phase}, {f.tensor}; found by a rerun)" if f.found_by == "rerun" else ""
        based = "".join(f"<li>{html.escape(b)}</li>" for b in f.based_on)
        parts.append(
            f'<div class="f {html.escape(f.severity)}"><span class="k">{html.escape(f.kind)}</span> '
            f"at <code>{html.escape(f.module or '(model)')}</code>, {_held_text(f)}{html.escape(origin)}<br>"
            f"{html.escape(f.message)}<br><span class=\"a\">Action: {html.escape(f.action)}</span>"
            + (f'<ul class="b">Based on:{based}</ul>' if based else "<br>")
            + f'<span class="note">{html.escape(ev)}</span></div>'
        )
    return "\n".join(parts)


def _page(title: str, head: list[tuple[str, Any]], notes: list[str], findings: list[StatsFinding],
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
    ("softmax entropy", "softmax", "entropy"), ("one-hot rows", "softmax", "onehot_frac"),
    ("grad std", "gradient", "std"), ("grad NaN", "gradient", "nan"),
]


def _nonfinite_table(series: RunSeries) -> str:
    counts = nonfinite_counts(series)
    first = {ev.step: ev for ev in series.nonfinite}
    rows = []
    o = series.nan_origin
    if o is not None and o.found:
        rows.append(f'<tr><td>{o.step}</td><td colspan="3" class="l">born here (found by a rerun): {html.escape(o.phase or "")}'
                    f', {html.escape(o.tensor or "")}</td><td class="l">{html.escape(o.module or "(model)")}</td></tr>')
    for i, step in enumerate(series.steps):
        ev = first.get(step)
        origin = next((c.module for c in ev.calls if not c.input_nonfinite), None) if ev else None
        rows.append(f"<tr><td>{step}</td>" + "".join(_cell(counts[k][i]) for k in ("outputs", "gradients", "parameters"))
                    + f'<td class="l">{html.escape(origin if origin is not None else "-") or "(model)"}</td></tr>')
    return ('<table><tr><th>step</th><th>calls with NaN/Inf outputs</th><th>modules with NaN/Inf gradients</th>'
            '<th>parameters holding NaN/Inf</th><th class="l">first module producing them</th></tr>'
            + "".join(rows) + "</table>")


def run_html(series: RunSeries, findings: list[StatsFinding], png: bytes | None, meta: dict[str, Any]) -> str:
    last = last_finite_index(series)
    flagged = {f.module for f in findings}
    head = "".join(f"<th>{html.escape(c)}</th>" for c, _, _ in _MODULE_COLS)
    rows = []
    for idx, name in enumerate(series.order):
        m = series.modules[name]
        cells = [_cell(m.at(kind, stat, last)) for _, kind, stat in _MODULE_COLS]  # type: ignore[arg-type]
        cells.append(_cell(cell(module_update_ratio(series, name), last)))
        cls = ' class="flag"' if name in flagged else ""
        rows.append(f'<tr{cls}><td>{idx}</td><td class="l">{html.escape(name or "(model)")}</td>'
                    f'<td class="l">{html.escape(m.type)}</td>{"".join(cells)}</tr>')
    modules_tbl = (f'<table><tr><th>#</th><th class="l">module</th><th class="l">type</th>{head}<th>update ratio</th></tr>'
                   + "".join(rows) + "</table>")
    trows = []
    for t, info in sorted(series.types.items()):
        values = [cell(getattr(info, k).get(s), last) for k, s in [("activation", "std"), ("activation", "zero_frac"),
                                                                   ("activation", "kurtosis"), ("activation", "nan"),
                                                                   ("gradient", "std")]]
        trows.append(f'<tr><td class="l">{html.escape(t)}</td><td>{len(info.modules)}</td>'
                     + "".join(_cell(v) for v in values) + _cell(cell(info.update_ratio, last)) + "</tr>")
    types_tbl = ('<table><tr><th class="l">type</th><th>modules</th><th>mean act std</th><th>mean zero</th>'
                 "<th>mean kurtosis</th><th>NaN</th><th>mean grad std</th><th>mean update ratio</th></tr>"
                 + "".join(trows) + "</table>")
    defs = "".join(f'<tr><td class="l">{html.escape(k)}</td><td class="l">{html.escape(v)}</td></tr>'
                   for k, v in series.definitions.items())
    head_rows = [
        ("run", meta.get("ref")), ("script", meta.get("script")), ("modules", len(series.order)),
        ("optimizer steps seen", series.steps_seen), ("sampled steps", len(series.steps)),
        ("every", series.every), ("execution order from", series.order_source), ("EMA alpha", series.ema_alpha),
    ]
    return _page(
        f"modulelens statistics: {meta.get('ref', '')}", head_rows, series.notes, findings, png,
        [(f"Modules at {step_label(series, last)} (execution order)", modules_tbl),
         (f"By module type at {step_label(series, last)}", types_tbl),
         ("NaN/Inf over steps", _nonfinite_table(series)), ("Definitions", f"<table>{defs}</table>")],
    )


def capture_html(series: CaptureSeries, findings: list[StatsFinding], png: bytes | None, meta: dict[str, Any]) -> str:
    stats_cols = ["mean", "std", "skew", "kurtosis", "zero_frac", "min", "max", "nan", "inf", "kl_gauss", "rms"]
    head = "".join(f"<th>{c}</th>" for c in stats_cols)
    rows = []
    for key, t in series.tensors.items():
        rows.append(f'<tr><td class="l">{html.escape(key)}</td><td class="l">{t.group}</td>'
                    f'<td class="l">{html.escape(str(t.shape))}</td><td class="l">{html.escape(t.dtype)}</td>'
                    f'{_cell(t.stored)}' + "".join(_cell(t.stats.get(c)) for c in stats_cols) + "</tr>")
    tbl = (f'<table><tr><th class="l">tensor</th><th class="l">group</th><th class="l">shape</th><th class="l">dtype</th>'
           f"<th>stored</th>{head}</tr>" + "".join(rows) + "</table>")
    head_rows = [("run", meta.get("ref")), ("capture", series.capture), ("module", series.module_path),
                 ("class", series.class_path), ("tensors", len(series.tensors))]
    return _page(f"modulelens statistics: capture {series.capture}", head_rows, series.notes, findings, png,
                 [("Tensors", tbl)])


def write_report(folder: Path, series: RunSeries | CaptureSeries, findings: list[StatsFinding], meta: dict[str, Any],
                 plots: bool = True) -> tuple[list[str], list[str]]:
    """Write ``report.png`` (when matplotlib is there) and ``report.html`` into ``folder``.
    Returns (files written, notes)."""
    notes: list[str] = []
    png: bytes | None = None
    capture = isinstance(series, CaptureSeries)
    if plots:
        if have_matplotlib():
            try:
                png = capture_figure_png(series, findings) if capture else run_figure_png(series, findings)  # type: ignore[arg-type]
            except Exception as e:  # noqa: BLE001 - a plotting failure must not lose the statistics
                notes.append(f"plotting failed ({type(e).__name__}: {e}); the HTML report has the tables only")
        else:
            notes.append(PLOTS_HINT)
    files = []
    if png is not None:
        (folder / "report.png").write_bytes(png)
        files.append("report.png")
    page = capture_html(series, findings, png, meta) if capture else run_html(series, findings, png, meta)  # type: ignore[arg-type]
    (folder / "report.html").write_text(page, encoding="utf-8")
    files.append("report.html")
    return files, notes
