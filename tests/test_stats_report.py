"""The report of a run whose last steps are all NaN: depth and per-type views at the last finite
step (saying so), and NaN/Inf counts over the steps."""

from __future__ import annotations

import torch
import torch.nn as nn

from modulelens.stats.collector import StatsCollector
from modulelens.stats.manifest import stats_manifest
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
    series = art.read_json("series.json")
    assert series["steps"] == [0, 2, 4, 6] and last_finite_index(series) == 2
    counts = nonfinite_counts(series)
    assert counts["outputs"][:3] == [0, 0, 0] and counts["outputs"][3] > 0 and counts["parameters"][3] >= 1
    summary = stats_manifest(art).summary
    assert summary.by_type_step == 4 and all(r.nonfinite == 0 for r in summary.by_type)
    page = (art.path / "report.html").read_text()
    assert "step 4, the last with finite values" in page and "NaN/Inf over steps" in page
    assert (art.path / "report.png").stat().st_size > 10_000
    assert [f["kind"] for f in stats.findings][:1] == ["nan_inf"] and stats.findings[0]["module"] == "0"
