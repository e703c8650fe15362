"""The report of a run whose last steps are all NaN: depth and per-type views at the last finite
step (saying so), and NaN/Inf counts over the steps."""

from __future__ import annotations

import torch
import torch.nn as nn

from modulelens.stats.collector import StatsCollector
from modulelens.stats.manifest import stats_manifest
from modulelens.stats.schema import NanOrigin, read_series
from modulelens.stats.series import build_series
from modulelens.stats.series import last_finite_index, nonfinite_counts


def test_a_run_that_ends_in_nan_is_reported_at_its_last_finite_step(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with StatsCollector(model, every=2, name="nanrun", repo=tmp_path, plots=True) as stats:
        for step in range(8):
            if step == 5:
                with torch.no_grad():
                    model[0].weight[0, 0] = float("nan")
            loss = model(torch.randn(3, 4)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    art = stats.artifact
    series = read_series(art)
    assert series.steps == [0, 2, 4, 6] and last_finite_index(series) == 2
    counts = nonfinite_counts(series)
    assert counts["outputs"][:3] == [0, 0, 0] and counts["outputs"][3] > 0 and counts["parameters"][3] >= 1
    summary = stats_manifest(art).summary
    assert summary.by_type_step == 4 and all(r.nonfinite == 0 for r in summary.by_type)
    page = (art.path / "report.html").read_text()
    assert "step 4, the last with finite values" in page and "NaN/Inf over steps" in page
    assert (art.path / "report.png").stat().st_size > 10_000
    assert [f.kind for f in stats.findings][:1] == ["nan_inf"] and stats.findings[0].module == "0"


def _nan_run(tmp_path, origin=None):
    """A run whose step 5 writes NaN into a weight, sampled every 2 steps, with a finding per kind
    that the legend must name."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1))
    with torch.no_grad():
        model[2].weight.mul_(20.0)  # tanh saturates
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    collector = StatsCollector(model, every=2, fx=False).start()
    for step in range(8):
        if step == 5:
            with torch.no_grad():
                model[0].weight[0, 0] = float("nan")
        loss = model(torch.randn(16, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return build_series(collector.finish(), nan_origin=origin)


def test_every_marker_on_the_plots_is_named_in_a_legend_and_the_nan_origin_is_marked(tmp_path):
    import matplotlib.pyplot as plt

    from modulelens.stats.findings import evaluate
    from modulelens.stats.plots import run_figure

    origin = NanOrigin(found=True, step=5, phase="forward", tensor="weight", module="0", parameter="0.weight")
    series = _nan_run(tmp_path, origin)
    findings = evaluate(series)
    assert {f.kind for f in findings} >= {"nan_inf", "saturation"}
    fig = run_figure(series, findings)
    try:
        labels = {t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()}
        titles = [ax.get_title() for ax in fig.axes]
    finally:
        plt.close(fig)
    assert "finding: saturation" in labels and "thick line: a module with a finding" in labels
    assert "NaN/Inf born (rerun): step 5, 0, forward" in labels and "first sampled step with NaN/Inf: 6" in labels
    assert "NaN/Inf born here (step 5, forward)" in labels  # on the depth profile
    assert "saturation finding at 0.5" in labels  # the rule's threshold on the saturation-over-steps panel
    assert any(t.startswith("saturated fraction") for t in titles) and any("softmax entropy" in t for t in titles)
    for ax in fig.axes:  # no unexplained line: every vertical/horizontal marker has a label
        for line in ax.get_lines():
            xs = line.get_xdata()
            if len(xs) == 2 and (xs[0] == xs[1] or list(line.get_ydata())[0] == list(line.get_ydata())[1]):
                assert not line.get_label().startswith("_") or line.get_alpha() == 0.25, line


def test_wandb_summary_keys_never_collide_with_logged_keys(tmp_path):
    from modulelens.stats.findings import evaluate
    from modulelens.stats.manifest import StatsManifest, StatsSummary
    from modulelens.stats.wandb_log import TABLE_KEYS, step_rows, summary_values

    series = _nan_run(tmp_path)
    findings = evaluate(series)
    summary = summary_values(StatsManifest(summary=StatsSummary(modules=6, steps_seen=8)), findings)
    logged = {k for row in step_rows(series) for k in row} | set(TABLE_KEYS)
    assert summary["gather_stats/findings"] == len(findings) and summary["gather_stats/nan_step"] == 6
    assert not set(summary) & logged
