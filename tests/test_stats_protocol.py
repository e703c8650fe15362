"""Typed records of modulelens.stats: the worker request/result and the stored manifest (files
written by the previous version still load)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch.nn as nn
from pydantic import ValidationError

from modulelens.errors import ModuleLensError
from modulelens.stats.collector import StatsCollector
from modulelens.stats.findings import evaluate
from modulelens.stats.manifest import StatsManifest
from modulelens.stats.runs import tensor_rows
from modulelens.stats.schema import CaptureSeries, RunSeries, StatsFinding
from modulelens.stats.worker import StatsWorkerRequest, StatsWorkerResult
from modulelens.workers import read_worker_result

FIXTURES = Path(__file__).parent / "fixtures"


def test_worker_request_round_trips_and_shares_the_collector_defaults():
    req = StatsWorkerRequest(script="/x/train.py", name="train", repo="/r", workdir="/x", script_args=["--lr", "1"])
    assert StatsWorkerRequest.model_validate_json(req.model_dump_json()) == req
    c = StatsCollector(nn.Linear(2, 2))
    assert (req.every, req.ema, req.sample) == (c.every, c.ema, c.sample)
    with pytest.raises(ValidationError):
        StatsWorkerRequest.model_validate_json('{"script": "/x.py"}')  # name and repo are required


def test_worker_result_reads_both_answers(tmp_path):
    ok, bad = tmp_path / "ok.json", tmp_path / "bad.json"
    ok.write_text('{"ok": true, "ref": "train:v1", "steps_seen": 12}')
    bad.write_text('{"ok": false, "error": "boom", "hint": "fix", "type": "CaptureFailed"}')
    result = read_worker_result(ok, StatsWorkerResult)
    assert result is not None and (result.ref, result.steps_seen) == ("train:v1", 12)
    with pytest.raises(ModuleLensError) as failed:
        read_worker_result(bad, StatsWorkerResult)
    assert (failed.value.message, failed.value.hint) == ("boom", "fix")


@pytest.mark.parametrize("fixture", ["stats_manifest_run_v1.json", "stats_manifest_capture_v1.json"])
def test_manifests_written_by_the_previous_version_load(fixture):
    m = StatsManifest.model_validate(json.loads((FIXTURES / fixture).read_text()))
    if m.summary.kind == "run":
        assert (m.summary.modules, m.summary.steps_seen, m.summary.order_source) == (4, 4, "fx")
        assert m.summary.by_type[0].type == "Linear" and m.source.kind == "api"
    else:
        assert m.summary.capture == "lin:v2" and m.source.capture == "lin:v2" and m.summary.tensors == 5


def test_series_and_findings_written_by_the_previous_version_load_and_are_judged_again():
    run = RunSeries.model_validate_json((FIXTURES / "stats_series_run_v1.json").read_text())
    assert run.schema_version == 1 and run.steps == [0, 2, 4] and run.nan_origin is None
    assert run.order == ["", "0", "1", "2", "3", "4"] and run.modules["3"].softmax == {}
    assert run.params["2.weight"].dead_rows == [] and run.nonfinite[0].step == 4
    old = [StatsFinding.model_validate(f) for f in json.loads((FIXTURES / "stats_findings_run_v1.json").read_text())]
    assert [(f.kind, f.module, f.found_by, f.based_on) for f in old] == [("nan_inf", "0", "sampled steps", [])]
    again = evaluate(run)
    assert [(f.kind, f.module, f.step) for f in again] == [("nan_inf", "0", 4)]
    assert "gather-stats" in again[0].action  # NaN spread by an optimizer step: says how to find where it starts
    cap = CaptureSeries.model_validate_json((FIXTURES / "stats_series_capture_v1.json").read_text())
    rows = tensor_rows(cap)
    assert cap.schema_version == 1 and {r.group for r in rows} == {"input", "output", "weight"}
    assert all(r.std is not None for r in rows)
