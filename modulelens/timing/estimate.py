"""The ratio of two timings from paired rounds, with a 95% confidence interval, and the decision
whether that ratio is determined.

A *round* times both sides back to back (ABBA: A, B, B, A, the order alternating between rounds)
and gives one ratio ``base / candidate`` of their per-call times: the speedup of the candidate.
Drift of the machine's load over seconds hits both halves of a round alike and cancels in the
ratio; what is left is round-to-round scatter.

**Estimator: the median of the per-round ratios**, with the distribution-free confidence
interval of a median from order statistics: for ``n`` rounds sorted ``r(1) <= ... <= r(n)``,
``[r(k), r(n-k+1)]`` covers the true median with probability ``1 - 2 P(Binomial(n, 1/2) < k)``;
``k`` is the largest that keeps this at or above 95%. Why this and not a bootstrap or a t-interval
on the mean: it assumes only that rounds are independent draws from one distribution (no
normality: round ratios on a busy machine are skewed and heavy-tailed), a few wild rounds (one
side descheduled) move neither the point nor the interval much, the answer is exact for small
``n`` where a bootstrap of the median is lumpy and optimistic, and it is deterministic, so the same
rounds always give the same report. It needs at least 6 rounds (with 5 even the full range
covers only 94%).

**Decision** (:func:`decide`): the ratio is *determined* when the interval's relative width
``(high - low) / point`` is at most the target and the interval does not straddle 1 while the
point lies farther than half the target from 1 (then "faster" and "slower" are both consistent
with the data). Otherwise it is *undetermined* and reported as null with the interval and why.
Everything here is a pure function of numbers, unit-tested on synthetic rounds.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

CONFIDENCE = 0.95
MIN_ROUNDS = 6  # the fewest rounds for which a 95% interval of the median exists


def surely_above_one(interval: tuple[float, float] | list[float] | None) -> bool:
    """Whether a ratio's 95% interval lies wholly above 1 (its lower bound is): the one test for
    "surely faster than eager" that every decision uses (pack entries, optimize's suggestions,
    validation advice). No interval (undetermined, not timed) is not surely anything."""
    return bool(interval) and interval[0] > 1.0


def _binomial_cdf_half(n: int, k: int) -> float:
    """P(Binomial(n, 1/2) <= k)."""
    return sum(math.comb(n, i) for i in range(0, k + 1)) / 2 ** n


def median_interval(values: list[float], confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """The distribution-free ``confidence`` interval of the median of ``values`` (order
    statistics, see the module docstring), or None when there are too few values for one."""
    xs = sorted(values)
    n = len(xs)
    best = None
    for k in range(1, n // 2 + 1):
        if 1 - 2 * _binomial_cdf_half(n, k - 1) >= confidence:
            best = k
        else:
            break
    if best is None:
        return None
    return xs[best - 1], xs[n - best]


@dataclass(frozen=True)
class RatioEstimate:
    """The median of per-round ratios and its interval (None when too few rounds)."""

    point: float
    low: float | None
    high: float | None
    rounds: int

    @property
    def relative_width(self) -> float:
        """(high - low) / point; infinite without an interval."""
        if self.low is None or self.high is None or self.point <= 0:
            return math.inf
        return (self.high - self.low) / self.point


def round_ratios(base_s: list[float], candidate_s: list[float]) -> list[float]:
    """Per-round speedups ``base / candidate`` of paired per-call times (rounds where either
    side has no positive time are left out)."""
    return [b / c for b, c in zip(base_s, candidate_s) if b > 0 and c > 0]


def estimate_ratio(ratios: list[float], confidence: float = CONFIDENCE) -> RatioEstimate:
    """Median of ``ratios`` with its order-statistics interval."""
    if not ratios:
        return RatioEstimate(point=math.nan, low=None, high=None, rounds=0)
    interval = median_interval(ratios, confidence)
    low, high = interval if interval else (None, None)
    return RatioEstimate(point=statistics.median(ratios), low=low, high=high, rounds=len(ratios))


def determined(est: RatioEstimate, target_width: float) -> tuple[bool, str]:
    """(whether ``est`` is determined, why not in words; empty when it is). See :func:`decide`."""
    if est.rounds < MIN_ROUNDS or est.low is None or est.high is None:
        return False, f"{est.rounds} usable round(s); a 95% interval needs {MIN_ROUNDS}"
    width = est.relative_width
    if width > target_width:
        return False, f"95% interval {est.low:.3g}x..{est.high:.3g}x is {width:.0%} wide (target {target_width:.0%})"
    if est.low < 1 < est.high and abs(est.point - 1) > target_width / 2:
        return False, f"95% interval {est.low:.3g}x..{est.high:.3g}x straddles 1, the point {est.point:.3g}x is far from it"
    return True, ""


def decide(est: RatioEstimate, target_width: float, blocking: list[str] | None = None) -> tuple[bool, str]:
    """Whether the ratio is determined, and the reason either way (one sentence). ``blocking``:
    noise findings that make any figure from these rounds untrustworthy (e.g. two modes)."""
    ok, why = determined(est, target_width)
    if ok and blocking:
        return False, "; ".join(blocking)
    if not ok:
        return False, why
    return True, (f"median of {est.rounds} paired rounds, 95% interval {est.low:.3g}x..{est.high:.3g}x "
                  f"({est.relative_width:.0%} wide, target {target_width:.0%})")
