"""Under torch.compile the sampled steps run eagerly: statistics equal those of the eager model, and
the hooks add no graph (no recompiles)."""

from __future__ import annotations

import torch
import torch.nn as nn

from modulelens.stats.collector import StatsCollector
from modulelens.stats.schema import RunSeries
from modulelens.stats.series import build_series


def _series(compiled: bool) -> tuple[RunSeries, StatsCollector]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    run_model = torch.compile(model, backend="eager") if compiled else model
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    collector = StatsCollector(run_model, every=2, fx=False).start()
    for _ in range(6):
        loss = run_model(torch.randn(4, 8, generator=g)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return build_series(collector.finish()), collector


def test_compiled_model_gets_exact_statistics_on_eager_sampled_steps():
    import torch._dynamo

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    eager, _ = _series(False)
    compiled, collector = _series(True)
    assert collector.compiled and collector.eager_sampled_steps == 3
    assert compiled.order == eager.order == ["", "0", "1", "2"]
    for name in eager.order:
        for kind in ("activation", "gradient"):
            assert getattr(compiled.modules[name], kind) == getattr(eager.modules[name], kind), (name, kind)
    assert any("ran it in eager mode" in n for n in compiled.notes)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1  # compiled once, never recompiled
