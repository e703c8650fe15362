"""Pure logic of modulelens.stats.ranks: merging the runs of several ranks."""

from __future__ import annotations

import pytest
import torch

from modulelens.stats import stats as S
from modulelens.stats.ranks import merge_ranks, read_ranks, write_rank
from modulelens.stats.records import ModuleStep, ParamStep, StatsRun, StepRecord


def _run(x: torch.Tensor, steps: list[int], extra: str | None = None) -> StatsRun:
    vec = S.to_host([S.moments(x)])[0]
    records = []
    for step in steps:
        modules = {"fc": ModuleStep(type="Linear", act=list(vec), in_sq=4.0, in_numel=8, calls=1, grad=list(vec))}
        if extra:
            modules[extra] = ModuleStep(type="ReLU", act=list(vec), calls=1)
        records.append(StepRecord(step=step, modules=modules, params={"fc.weight": ParamStep(module="fc", numel=4)}))
    return StatsRun(records=records, order=["fc", *([extra] if extra else [])], order_source="observed",
                    types={"fc": "Linear"}, class_paths={}, param_shapes={}, every=1, steps_seen=len(steps),
                    step_on="optimizer", notes=[])


def test_merged_moments_equal_those_of_every_rank_together(tmp_path):
    a, b = torch.randn(100, dtype=torch.float64), torch.randn(37, dtype=torch.float64) * 3 + 1
    runs = [_run(a, [0, 2]), _run(b, [0, 2, 4], extra="branch")]
    for rank, run in enumerate(runs):
        write_rank(tmp_path, rank, run)
    merged = merge_ranks(read_ranks(tmp_path, range(2), timeout=1))
    assert [r.step for r in merged.records] == [0, 2, 4] and merged.order == ["fc", "branch"]
    fc = merged.records[0].modules["fc"]
    whole = S.finalize(S.to_host([S.moments(torch.cat([a, b]))])[0])
    for key, value in S.finalize(fc.act).items():
        assert value == pytest.approx(whole[key], rel=1e-9, abs=1e-12), key
    assert (fc.calls, fc.in_numel, fc.in_sq) == (2, 16, 8.0)
    assert "branch" in merged.records[0].modules and "2 ranks merged" in merged.notes[-1]
    assert merged.records[2].modules["fc"].calls == 1  # step 4 ran on rank 1 only
    assert runs[0].records[0].modules["fc"].calls == 1  # the inputs are not modified


def test_a_missing_rank_is_a_clear_error(tmp_path):
    with pytest.raises(Exception, match="rank 1 did not finish"):
        read_ranks(tmp_path, range(1, 2), timeout=0.2)
