"""gather-stats over unmodified training scripts (CLI, worker subprocess): planted faults are found
and attributed to the right module, healthy runs give no findings, data-dependent control flow
keeps a correct order, in-place activations and torch.compile do not break the run."""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path

import pytest
from conftest import EXAMPLES, TRAIN

pytestmark = pytest.mark.slow

FAULTS = EXAMPLES / "faults" / "train.py"


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("stats-repo")


def _gather(cli, repo, script, *script_args, every=5, extra=(), plots=False):
    extra = (*extra, "--plots" if plots else "--no-plots", "--top", "100")
    code, data, r = cli("gather-stats", script, "--every", every, *extra, "--repo", repo, "--json", "--", *script_args)
    assert code == 0, r.output
    return data


def _kinds(data):
    return [(f["kind"], f["module"]) for f in data["findings"]]


def test_healthy_twin_gives_no_findings(cli, repo):
    data = _gather(cli, repo, FAULTS, "--fault", "none", "--steps", "30", plots=True)
    assert data["findings"] == []
    assert data["run_id"] == "train:v1" and data["modules"] == 15
    assert data["steps_seen"] == 30 and data["steps_sampled"] == 6 and data["order_source"] == "fx"
    assert data["order"][:4] == ["", "inp", "blocks.0", "blocks.0.fc"]
    html = Path(data["report_html"]).read_text()
    assert "data:image/png;base64," in html and Path(data["report_png"]).stat().st_size > 10_000
    series = json.loads(Path(data["series_file"]).read_text())
    assert series["steps"] == [0, 5, 10, 15, 20, 25]
    assert {"activation", "activation_ema", "gradient", "gradient_ema"} <= set(series["modules"]["blocks.0.fc"])
    assert series["params"]["head.weight"]["update_ratio"][-1] > 0
    assert {r["type"] for r in data["by_type"]} == {"MLP", "Linear", "Block", "ReLU"}


@pytest.mark.parametrize(
    ("fault", "module", "kind", "extra"),
    [
        ("dead-relu", "blocks.2.act", "dead_activation", ()),
        ("dead-relu", "blocks.1.act", "dead_activation", ("--inplace",)),
        ("explode", "blocks.1.fc", "exploding_activation", ()),
        ("nan", "blocks.2.fc", "nan_inf", ()),
        ("nan", "blocks.1.act", "nan_inf", ("--inplace",)),
    ],
)
def test_planted_fault_is_found_at_its_module(cli, repo, fault, module, kind, extra):
    data = _gather(cli, repo, FAULTS, "--fault", fault, "--module", module, "--steps", "12", *extra,
                   extra=("--name", f"{fault}-{module}"))
    assert (kind, module) in _kinds(data)
    # The fault's own finding comes first and no other module is blamed for it.
    assert [m for k, m in _kinds(data) if k == kind] == [module]
    if fault == "explode":  # the gradient grows 1000x going backward through the same module
        assert ("exploding_gradient", module) in _kinds(data)
    f = next(f for f in data["findings"] if f["kind"] == kind)
    assert f["message"] and f["action"] and f["evidence"]


def test_nan_born_between_sampled_steps_is_found_by_a_rerun(cli, repo):
    """Sampled every 5 steps, a division by zero at step 7 in blocks.1.act is first seen at step 10,
    when the optimizer has spread NaN into every weight; the rerun names its module, step and phase."""
    args = ("--fault", "nan-at", "--module", "blocks.1.act", "--at", "7", "--steps", "12")
    data = _gather(cli, repo, FAULTS, *args, extra=("--name", "nan-at"))
    f = data["findings"][0]
    assert (f["kind"], f["module"], f["step"], f["phase"], f["tensor"], f["found_by"]) == \
        ("nan_inf", "blocks.1.act", 7, "forward", "output", "rerun")
    assert f["first_step"] == 10 and "rerunning the script" in f["message"] and f["evidence"]["steps_checked"] == 8
    # Off with a flag: the sampled steps alone name where NaN shows first, and say how to find more.
    data = _gather(cli, repo, FAULTS, *args, extra=("--name", "nan-at-off", "--no-nan-rerun"))
    f = data["findings"][0]
    assert f["kind"] == "nan_inf" and f["found_by"] == "sampled steps" and f["phase"] is None
    assert f["step"] == 10 and "gather-stats" in f["action"]
    assert any("--no-nan-rerun" in n for n in data["notes"])


def test_tinyformer_is_healthy_and_stops_after_steps(cli, repo):
    data = _gather(cli, repo, TRAIN, "--steps", "50", every=3, extra=("--steps", "7"))
    assert data["findings"] == []
    assert data["steps_seen"] == 7 and data["steps_sampled"] == 3
    assert data["order_source"] == "observed"  # tinyformer's forward unpacks x.shape: fx cannot trace it
    order = data["order"]
    assert order.index("tok_emb") < order.index("blocks.0.attn.qkv") < order.index("blocks.0.mlp.fc1") < order.index("lm_head")
    assert "step    5" in data["script_output_tail"] and "step   10" not in data["script_output_tail"]


CONTROL_FLOW = '''
import torch, torch.nn as nn

class Router(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(16, 2)      # defined first, runs last
        self.big = nn.Linear(16, 16)
        self.small = nn.Linear(16, 16)
        self.stem = nn.Linear(8, 16)      # defined last, runs first

    def forward(self, x):
        h = torch.relu(self.stem(x))
        if h.mean() > 0.0:                # data-dependent: torch.fx cannot trace this
            h = self.big(h)
        else:
            h = self.small(h)
        return self.head(h)

torch.manual_seed(0)
model = Router()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(6):
    loss = model(torch.randn(4, 8)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
'''


def test_data_dependent_control_flow_gets_observed_order(cli, repo, tmp_path):
    script = tmp_path / "router.py"
    script.write_text(CONTROL_FLOW)
    data = _gather(cli, repo, script, every=2)
    assert data["order_source"] == "observed"
    assert data["order"] == ["", "stem", "big", "head"]
    assert any("torch.fx could not trace" in n for n in data["notes"])


def test_forward_steps_count_every_call_of_the_model(cli, repo, tmp_path):
    """``--every 1 --step-on forward -- --steps 5`` saw 5 steps (it reported steps_seen 4)."""
    script = tmp_path / "forward_only.py"
    script.write_text(textwrap.dedent('''
        import argparse, torch
        p = argparse.ArgumentParser(); p.add_argument("--steps", type=int); args = p.parse_args()
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        for _ in range(args.steps):
            model(torch.randn(2, 4)).sum().backward()
    '''))
    data = _gather(cli, repo, script, "--steps", "5", every=1, extra=("--step-on", "forward"))
    assert data["steps_seen"] == 5 and data["steps_sampled"] == 5


def test_torch_compile_runs_eager_with_a_note(cli, repo, tmp_path):
    script = tmp_path / "compiled.py"
    script.write_text(textwrap.dedent('''
        import torch, torch.nn as nn
        model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
        cmodel = torch.compile(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(3):
            loss = cmodel(torch.randn(4, 8)).pow(2).mean()
            opt.zero_grad(); loss.backward(); opt.step()
    '''))
    data = _gather(cli, repo, script, every=1)
    assert data["modules"] == 4 and data["order"] == ["", "0", "1", "2"]
    assert any("torch.compile" in n and "eager" in n for n in data["notes"])


def test_timeout_stops_at_a_step_and_keeps_statistics(cli, repo, tmp_path):
    script = tmp_path / "forever.py"
    script.write_text(textwrap.dedent('''
        import time, torch, torch.nn as nn
        model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        while True:
            model(torch.randn(2, 4)).sum().backward(); opt.step(); opt.zero_grad()
            time.sleep(0.05)
    '''))
    # Generous limit: on a loaded machine importing torch alone can take 10 s or more.
    data = _gather(cli, repo, script, every=1, extra=("--timeout", "25"))
    assert data["steps_seen"] >= 1 and data["steps_sampled"] >= 1
    assert any("time limit" in n for n in data["notes"])


def test_errors_and_human_output(cli, repo, tmp_path):
    code, err, _ = cli("gather-stats", tmp_path / "missing.py", "--repo", repo, "--json")
    assert code == 2 and "does not exist" in err["error"]
    code, err, _ = cli("gather-stats", "--repo", repo, "--json")
    assert code == 2 and "exactly one" in err["error"]
    bad = tmp_path / "crash.py"
    bad.write_text("raise ValueError('bad batch')\n")
    code, err, _ = cli("gather-stats", bad, "--repo", repo, "--json")
    assert code == 2 and "bad batch" in err["error"] and "crash.py:1" in err["error"]
    assert "a training step was sampled" in err["hint"] and "capture" not in err["hint"], err  # not capture's text
    code, _, r = cli("gather-stats", FAULTS, "--every", "4", "--steps", "5", "--no-plots", "--repo", repo, "--",
                     "--fault", "dead-relu", "--module", "blocks.0.act")
    assert code == 0, r.output
    assert "dead_activation" in r.stdout and "blocks.0.act" in r.stdout and "report:" in r.stdout


def test_every_sampled_step_is_judged_through_the_cli(cli, repo):
    """A branch taken on steps 0, 2, 4, 8, 10 only (not on the last step, 11) that blows up 590x."""
    data = _gather(cli, repo, EXAMPLES / "faults" / "zoo.py", "--case", "branch", every=1, extra=("--steps", "12"))
    assert [(f["kind"], f["module"]) for f in data["findings"]] == [("exploding_activation", "branch")]
    f = data["findings"][0]
    assert (f["first_step"], f["last_step"], f["steps_held"]) == (0, 10, 5)


def test_wandb_offline_run_holds_series_findings_and_report(cli, repo, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    data = _gather(cli, repo, FAULTS, "--fault", "dead-relu", "--module", "blocks.0.act", "--steps", "5", every=2,
                   extra=("--name", "wandb-run", "--wandb"), plots=True)
    run_dir = Path(data["wandb_run"])
    assert run_dir.parent == tmp_path / "wandb" and run_dir.name.startswith("offline-run-")
    [records] = run_dir.glob("run-*.wandb")
    raw = records.read_bytes()
    assert b"activation/rms/blocks.0.fc" in raw and b"update_ratio/head.weight" in raw
    deadline = time.monotonic() + 30  # W&B's writer flushes the run's last block (the summary) on its own time
    while b"gather_stats/findings" not in raw and time.monotonic() < deadline:
        time.sleep(0.5)
        raw = records.read_bytes()
    assert b"gather_stats/findings" in raw  # the count: the "findings" key keeps the table
    [table] = (run_dir / "files" / "media" / "table").glob("findings_*.table.json")
    assert ["dead_activation", "blocks.0.act"] == json.loads(table.read_text())["data"][0][:2]
    assert list((run_dir / "files" / "media" / "html").glob("report_*.html"))


def test_torchrun_ranks_are_merged_by_rank0(cli, repo):
    data = _gather(cli, repo, TRAIN, "--ddp", "--steps", "3", every=1,
                   extra=("--nproc", "2", "--name", "ddp-stats", "--steps", "3"))
    assert data["steps_sampled"] == 3 and any("2 ranks merged" in n for n in data["notes"])
    series = json.loads(Path(data["series_file"]).read_text())
    assert series["modules"]["tok_emb"]["activation"]["calls"] == [2, 2, 2]  # one call per rank and step
    assert "module" not in series["order"] and "tok_emb" in series["order"]  # DDP's wrapper is skipped
