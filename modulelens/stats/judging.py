"""The shared pieces of the statistics rules (:mod:`modulelens.stats.findings`,
:mod:`modulelens.stats.rules`, :mod:`modulelens.stats.advice`): the default thresholds, the finding
constructor, number formatting and the module-tree helpers (names are dotted paths; '' is the root)."""

from __future__ import annotations

import math
from typing import Any

from modulelens.stats.schema import RunSeries, StatsFinding

DEFAULT_THRESHOLDS: dict[str, float] = {
    "dead_zero_frac": 0.95,
    "dead_unit_frac": 0.5,
    "explode_gain": 30.0,
    "explode_rms": 30.0,
    "explode_abs_rms": 1e4,
    "vanish_gain": 1e-3,
    "vanish_abs_rms": 1e-4,
    "vanish_rms": 1e-2,
    "explode_grad_ratio": 300.0,
    "vanish_grad_ratio": 1e-3,
    "saturation_frac": 0.5,
    "softmax_max_prob": 0.9,
    "softmax_entropy": 0.15,
    "jump_factor": 10.0,
    "spike_factor": 10.0,
    "grad_to_weight_abs": 10.0,
    "grad_to_weight_alone": 1e3,
    "update_ratio_abs": 0.1,
    "update_ratio_alone": 1.0,
}


def finding(kind: str, module: str, step: int, severity: str, message: str, action: str,
            evidence: dict[str, Any], **extra: Any) -> StatsFinding:
    """A finding with its evidence rounded to 4 significant digits (non-finite numbers as None)."""
    return StatsFinding(kind=kind, module=module, step=step, severity=severity, message=message,  # type: ignore[arg-type]
                        action=action, evidence={k: _num(v) for k, v in evidence.items()}, **extra)


def _num(v: Any) -> Any:
    if isinstance(v, float):
        return float(f"{v:.4g}") if math.isfinite(v) else None
    return v


def fmt(x: Any) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, float):
        return f"{x:.3g}"
    return str(x)


def label(name: str) -> str:
    return name if name else "the model (root)"


def innermost(names: list[str]) -> list[str]:
    """Drop any name that has a descendant in the list (keep the innermost module)."""
    keep = []
    for n in names:
        prefix = n + "." if n else ""
        if not any(o != n and (n == "" or o.startswith(prefix)) for o in names):
            keep.append(n)
    return keep


def is_ancestor(a: str, b: str) -> bool:
    """True when module ``a`` contains module ``b``."""
    return a != b and (a == "" or b.startswith(a + "."))


def leaves(series: RunSeries) -> list[str]:
    order = series.order
    return [n for n in order if not any(is_ancestor(n, o) for o in order)]
