"""Log a stored statistics run to Weights & Biases (``gather-stats --wandb``).

The run is read back from the repository, so what W&B shows is what was stored: per sampled step
(the W&B step is the training step) ``activation/<stat>/<module>`` and ``gradient/<stat>/<module>``
for the statistics in :data:`LOGGED`, ``update_ratio/<parameter>`` and the NaN/Inf counts
``nonfinite/<what>`` and the softmax statistics ``softmax/<stat>/<module>``; then the findings as a
table (``findings``), the HTML report (``report``), and the run summary under ``gather_stats/``
(:func:`summary_values`), whose keys never collide with the logged ones. W&B's own
settings apply (``WANDB_MODE=offline``, ``WANDB_DIR``, ``WANDB_PROJECT``, ``WANDB_ENTITY``); nothing is
printed to stdout (it may be the MCP protocol).
"""

from __future__ import annotations

import os
from typing import Any

from modulelens.errors import ModuleLensError
from modulelens.repo import Artifact
from modulelens.stats.manifest import StatsManifest, stats_manifest
from modulelens.stats.schema import RunSeries, StatsFinding, read_findings, read_series
from modulelens.stats.series import nonfinite_counts

LOGGED = ("mean", "std", "rms", "skew", "kurtosis", "zero_frac", "min", "max", "nan", "inf", "kl_gauss", "gain",
          "sat_frac")
SOFTMAX_LOGGED = ("entropy", "max_prob", "onehot_frac")
FINDING_COLUMNS = ("kind", "module", "severity", "first_step", "last_step", "steps_held", "message", "action")
TABLE_KEYS = ("findings", "report")  # logged once, after the per-step rows
SUMMARY_PREFIX = "gather_stats/"


def step_rows(series: RunSeries) -> list[dict[str, float]]:
    """One W&B row per sampled step (numbers only; undefined statistics are left out)."""
    rows: list[dict[str, float]] = [{} for _ in series.steps]

    def put(key: str, column: list[Any] | None) -> None:
        for i, v in enumerate(column or []):
            if isinstance(v, (int, float)) and not isinstance(v, bool) and i < len(rows):
                rows[i][key] = v

    for name, module in series.modules.items():
        label = name or "(model)"
        for stat in LOGGED:
            put(f"activation/{stat}/{label}", module.activation.get(stat))
            put(f"gradient/{stat}/{label}", module.gradient.get(stat))
        for stat in SOFTMAX_LOGGED:
            put(f"softmax/{stat}/{label}", module.softmax.get(stat))
    for pname, param in series.params.items():
        put(f"update_ratio/{pname}", param.update_ratio)
    for what, counts in nonfinite_counts(series).items():
        for i, v in enumerate(counts):
            rows[i][f"nonfinite/{what}"] = v
    return rows


def summary_values(manifest: StatsManifest, findings: list[StatsFinding]) -> dict[str, Any]:
    """The run summary: counts under ``gather_stats/`` (the ``findings`` key holds the table)."""
    origin = next((f for f in findings if f.kind == "nan_inf"), None)
    values: dict[str, Any] = {"findings": len(findings), "errors": sum(f.severity == "error" for f in findings),
                              "modules": manifest.summary.modules, "steps_seen": manifest.summary.steps_seen,
                              "steps_sampled": manifest.summary.steps_sampled}
    if origin is not None:
        values.update(nan_module=origin.module, nan_step=origin.step, nan_phase=origin.phase or "")
    return {SUMMARY_PREFIX + k: v for k, v in values.items()}


def log_to_wandb(art: Artifact, project: str | None = None) -> str:
    """Log the stored run ``art`` to a new W&B run named after its reference; returns the W&B run's
    local folder (offline mode) or its URL."""
    try:
        import wandb
    except ImportError:
        raise ModuleLensError("[--wandb] needs the wandb package", "pip install 'modulelens[wandb]'") from None
    manifest = stats_manifest(art)
    if manifest.summary.kind != "run":
        raise ModuleLensError("[--wandb] logs training runs, not the statistics of a capture",
                              "drop [--wandb], or run gather-stats on a training script")
    series = read_series(art)
    findings = read_findings(art)
    assert isinstance(series, RunSeries)
    run = wandb.init(
        project=project or os.environ.get("WANDB_PROJECT") or "modulelens", name=art.ref, job_type="gather-stats",
        config={"stats_ref": art.ref, **manifest.source.model_dump(exclude_none=True),
                "every": manifest.summary.every, "order_source": manifest.summary.order_source},
        settings=wandb.Settings(silent=True, console="off"),
        dir=os.environ.get("WANDB_DIR") or None,  # now, not as at W&B's first setup in this process
    )
    try:
        for step, row in zip(series.steps, step_rows(series)):
            run.log(row, step=step)
        extra: dict[str, Any] = {"findings": wandb.Table(
            columns=list(FINDING_COLUMNS), data=[[getattr(f, c) for c in FINDING_COLUMNS] for f in findings])}
        if art.has_file("report.html"):
            extra["report"] = wandb.Html(art.file("report.html").read_text())
        run.log(extra)
        run.summary.update(summary_values(manifest, findings))
        where = run.url or os.path.dirname(run.dir)
    finally:
        run.finish()
    return where
