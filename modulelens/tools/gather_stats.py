"""gather_stats: per-module activation/gradient statistics of a training run (or of a capture),
with findings and a report."""

from __future__ import annotations

import time
from typing import Literal

from pydantic import BaseModel, Field, model_validator

from modulelens.capture import KIND as CAPTURES
from modulelens.listing import MAX_ITEMS, LeftOut, keep_first
from modulelens.paths import input_script
from modulelens.registry import ToolContext, tool
from modulelens.replies import ToolReply, call
from modulelens.repo import Artifact, Repository, validate_name
from modulelens.stats.collector import DEFAULT_EVERY
from modulelens.stats.manifest import KIND as STATS
from modulelens.stats.manifest import TypeRow, stats_manifest
from modulelens.stats.runs import TensorStatsRow, tensor_rows
from modulelens.stats.schema import RunSeries, StatsFinding, read_findings, read_series
from modulelens.stats.series import DEFAULT_EMA
from modulelens.stats.stats import DEFAULT_SAMPLE
from modulelens.stats.worker import StatsWorkerRequest, gather_script_stats


class GatherStatsRequest(BaseModel):
    script: str | None = Field(
        None,
        description="Training script, run as is; each optimizer.step() ends a step.",
        json_schema_extra={"cli": "argument"},
    )
    script_args: list[str] = Field(
        default_factory=list,
        json_schema_extra={"cli": "argument"},
    )
    capture: str | None = Field(
        None,
        description="Or: a capture ref.",
    )
    every: int = Field(DEFAULT_EVERY, ge=1, description="Sample every N-th step.")
    steps: int | None = Field(None, ge=1, description="Stop after N steps.")
    name: str | None = Field(None)
    ema: float = Field(DEFAULT_EMA, ge=0.0, lt=1.0, description="Smoothing alpha.")
    step_on: Literal["optimizer", "forward"] = Field(
        "optimizer", description="forward: no optimizer in the loop.")
    eager: bool = Field(True, description="No torch.compile (false: on sampled steps only).")
    params: bool = Field(True, description="Also weight and update statistics.")
    fx: bool = Field(True)
    sample: int = Field(DEFAULT_SAMPLE, ge=0, description="Moments of larger tensors from N strided elements "
                        "(0: all; contiguous float CPU ones: all).")
    plots: bool = Field(True)
    thresholds: dict[str, float] = Field(
        default_factory=dict,
        description="Per finding (dead_zero_frac, ...).",
    )
    nproc: int = Field(1, ge=1, description="Processes under torchrun.")
    nan_rerun: bool = Field(True, description="Rerun to find where NaN/Inf began.")
    wandb: bool = Field(False)
    wandb_project: str | None = Field(None)
    timeout: float = Field(3600.0, gt=0, description="Seconds (stops at a step).")
    top: int = Field(20, ge=1, le=MAX_ITEMS, description="Items listed per list; all are stored.")

    @model_validator(mode="after")
    def _one_source(self) -> GatherStatsRequest:
        if bool(self.script) == bool(self.capture):
            raise ValueError("give either a script or [--capture] (exactly one)")
        if self.wandb and self.capture:
            raise ValueError("[--wandb] logs training runs, not the statistics of a capture")
        return self




_STATS_DOC = (
    "Statistics are over the finite elements: std is the population std (ddof=0); skew is "
    "scipy.stats.skew(bias=True); kurtosis is the EXCESS (Fisher) kurtosis, scipy.stats.kurtosis(fisher=True, "
    "bias=True); kl_gauss = KL(N(mean, std^2) || N(0, 1)) = log(1/std) + (std^2 + mean^2 - 1)/2, the closed-form "
    "KL of the Gaussian fit to a unit Gaussian; zero_frac, nan and inf count all elements; sampled says whether the "
    "moments of a large tensor were estimated from a strided sample (heavy-tailed tensors are always exact)."
)


class GatherStatsResult(ToolReply):
    run_id: str = Field(description="Reference of the stored statistics (name:vN, kind 'stats' in the repository).")
    source: Literal["script", "capture"]
    modules: int = Field(description="Number of modules with statistics (1 for a capture).")
    steps_seen: int = Field(0, description="Optimizer steps (or model calls with step_on=forward) the run made.")
    steps_sampled: int = Field(0, description="Steps on which statistics were taken.")
    order_source: Literal["fx", "observed", "capture"] = Field(
        description="Where the module order comes from: torch.fx node order, or the observed first-call order.")
    order: list[str] = Field(default_factory=list, description="Module names in execution order (first 200).")
    findings: list[StatsFinding] = Field(default_factory=list)
    by_type: list[TypeRow] = Field(default_factory=list, description="Per-type aggregates (means over modules of "
                                   "that type) at the last sampled step where values are finite (by_type_step).")
    by_type_step: int | None = Field(None, description="The step of by_type (earlier than the last sampled step "
                                     "when later steps held NaN/Inf).")
    report_html: str | None = Field(None, description="Self-contained HTML report (plots embedded).")
    report_png: str | None = Field(None, description="The plots as one PNG (None without matplotlib).")
    tensors: list[TensorStatsRow] = Field(default_factory=list, description="Capture only: statistics of each stored "
                                     "tensor (first 200). " + _STATS_DOC)
    series_file: str = Field("", description="series.json: raw and EMA series per module (activation = module "
                             "output, gradient = gradient w.r.t. the module output), per parameter (weight, grad, "
                             "update_ratio) and per type. " + _STATS_DOC)
    path: str = Field("", description="Folder of this version in the repository.")
    notes: list[str] = Field(default_factory=list)
    script_output_tail: str = Field("", description="Last lines the script printed.")
    script_file: str = Field("", description="The script that ran (resolved); empty for a capture.")
    wandb_run: str | None = Field(None, description="With [--wandb]: the W&B run's URL, or its local folder offline.")
    seconds: float = 0.0
    left_out: list[LeftOut] = Field(default_factory=list, description="Lists cut to `top` items.")


def _result(art: Artifact, source: str, top: int | None, tail: str = "", seconds: float = 0.0) -> GatherStatsResult:
    """The result for the stored run ``art``: order, findings and tensors cut to ``top`` (the
    stored series and findings files have them all)."""
    summary = stats_manifest(art).summary
    series = read_series(art)
    files = summary.report_files
    result = GatherStatsResult(
        run_id=art.ref, source=source,  # type: ignore[arg-type]
        modules=summary.modules, steps_seen=summary.steps_seen, steps_sampled=summary.steps_sampled,
        order_source=summary.order_source,
        order=series.order[:200] if isinstance(series, RunSeries) else [],
        findings=read_findings(art),
        by_type=summary.by_type, by_type_step=summary.by_type_step,
        report_html=str(art.file("report.html")) if "report.html" in files else None,
        report_png=str(art.file("report.png")) if "report.png" in files else None,
        tensors=tensor_rows(series)[:200],
        series_file=str(art.file("series.json")), path=str(art.path), notes=summary.notes,
        script_output_tail=tail[-1500:], seconds=round(seconds, 3),
    )
    bad = [f for f in result.findings if f.kind.startswith("nan_inf")]
    if bad and bad[0].found_by == "rerun":
        f = bad[0]
        result.warnings.append(f"NaN/Inf born in {f.module or 'the model'} at step {f.step} ({f.phase}, {f.tensor}; "
                               "found by a rerun)")
    elif bad:
        result.warnings.append(f"NaN/Inf first seen in {bad[0].module or 'the model'} ({bad[0].kind})")
    if source == "script" and result.steps_sampled == 0:
        result.warnings.append("no step was sampled: the script ran no optimizer step (try [--step-on forward]) or "
                               "fewer steps than [--every N]")
    result.next = [call("show", kind="stats", ref=art.ref)]
    result = keep_first(result, "order", top, str(art.file("series.json")))
    result = keep_first(result, "findings", top, str(art.file("findings.json")))
    return keep_first(result, "tensors", top, str(art.file("series.json")))


@tool
def gather_stats(req: GatherStatsRequest, ctx: ToolContext) -> GatherStatsResult:
    """Per-module activation, gradient and weight statistics and findings, of a training script or a capture."""
    repo = Repository(ctx.repo_root)
    t0 = time.perf_counter()
    if req.capture:
        from modulelens.stats.artifact import save_capture_stats

        cap = repo.open(CAPTURES, req.capture)
        name = validate_name(req.name) if req.name else cap.name
        ctx.progress(0, 1, f"statistics of capture {cap.ref}")
        art, _, _ = save_capture_stats(repo, name, cap, plots=req.plots, thresholds=req.thresholds)
        ctx.progress(1, 1, f"stored {art.ref}")
        return _result(art, "capture", req.top, seconds=time.perf_counter() - t0)

    from modulelens.stats.artifact import default_stats_name

    script = input_script(req.script or "", ctx.project, "script")
    name = validate_name(req.name) if req.name else default_stats_name(script)
    request = StatsWorkerRequest(
        script=str(script), script_args=req.script_args, name=name, repo=str(repo.root), workdir=str(ctx.project),
        every=req.every, steps=req.steps, step_on=req.step_on, eager=req.eager, params=req.params, fx=req.fx,
        ema=req.ema, plots=req.plots, sample=req.sample, thresholds=req.thresholds, nproc=req.nproc,
        nan_rerun=req.nan_rerun,
        # Stop at a step boundary with time left to store the statistics before the hard limit.
        stop_at=time.time() + req.timeout - min(60.0, 0.2 * req.timeout),
    )
    ctx.progress(0, 1, f"running {script.name} with statistics every {req.every} step(s)")
    result, tail = gather_script_stats(request, timeout=req.timeout)
    art = repo.open(STATS, result.ref)
    ctx.progress(1, 1, f"stored {art.ref}")
    out = _result(art, "script", req.top, tail, time.perf_counter() - t0)
    out.script_file = str(script)
    if req.wandb:
        from modulelens.stats.wandb_log import log_to_wandb

        out.wandb_run = log_to_wandb(art, req.wandb_project)
    return out
