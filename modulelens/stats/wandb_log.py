"""Log a stored statistics run to Weights & Biases (``gather-stats --wandb``).

The run is read back from the repository, so what W&B shows is what was stored: per sampled step
(the W&B step is the training step) ``activation/<stat>/<module>`` and ``gradient/<stat>/<module>``
for the statistics in :data:`LOGGED`, ``update_ratio/<parameter>`` and the NaN/Inf counts
``nonfinite/<what>``; then the findings as a table, the HTML report, and the run summary. W&B's own
settings apply (``WANDB_MODE=offline``, ``WANDB_DIR``, ``WANDB_PROJECT``, ``WANDB_ENTITY``); nothing is
printed to stdout (it may be the MCP protocol).
"""

from __future__ import annotations

import os
from typing import Any

from modulelens.errors import ModuleLensError
from modulelens.repo import Artifact
from modulelens.stats.manifest import stats_manifest
from modulelens.stats.series import nonfinite_counts

LOGGED = ("mean", "std", "rms", "skew", "kurtosis", "zero_frac", "min", "max", "nan", "inf", "kl_gauss", "gain",
          "sat_frac")
FINDING_COLUMNS = ("kind", "module", "severity", "first_step", "last_step", "steps_held", "message", "action")


def step_rows(series: dict[str, Any]) -> list[dict[str, float]]:
    """One W&B row per sampled step (numbers only; undefined statistics are left out)."""
    rows: list[dict[str, float]] = [{} for _ in series["steps"]]
    for name, module in series["modules"].items():
        label = name or "(model)"
        for kind in ("activation", "gradient"):
            for stat in LOGGED:
                for i, v in enumerate(module.get(kind, {}).get(stat) or []):
                    if isinstance(v, (int, float)) and not isinstance(v, bool):
                        rows[i][f"{kind}/{stat}/{label}"] = v
    for pname, param in series.get("params", {}).items():
        for i, v in enumerate(param.get("update_ratio") or []):
            if v is not None:
                rows[i][f"update_ratio/{pname}"] = v
    for what, counts in nonfinite_counts(series).items():
        for i, v in enumerate(counts):
            rows[i][f"nonfinite/{what}"] = v
    return rows


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
    series = art.read_json("series.json")
    findings = art.read_json("findings.json")
    run = wandb.init(
        project=project or os.environ.get("WANDB_PROJECT") or "modulelens", name=art.ref, job_type="gather-stats",
        config={"stats_ref": art.ref, **manifest.source.model_dump(exclude_none=True),
                "every": manifest.summary.every, "order_source": manifest.summary.order_source},
        settings=wandb.Settings(silent=True, console="off"),
        dir=os.environ.get("WANDB_DIR") or None,  # now, not as at W&B's first setup in this process
    )
    try:
        for step, row in zip(series["steps"], step_rows(series)):
            run.log(row, step=step)
        extra: dict[str, Any] = {"findings": wandb.Table(
            columns=list(FINDING_COLUMNS), data=[[f.get(c) for c in FINDING_COLUMNS] for f in findings])}
        if art.has_file("report.html"):
            extra["report"] = wandb.Html(art.file("report.html").read_text())
        run.log(extra)
        run.summary.update({"findings": len(findings), "modules": manifest.summary.modules,
                            "steps_seen": manifest.summary.steps_seen})
        where = run.url or os.path.dirname(run.dir)
    finally:
        run.finish()
    return where
