"""Timing: how long things take, and how much faster one is than another, as a measurement with
an error bar or as "undetermined".

A leaf package: it imports only the standard library, torch and pydantic, so every place that
times (validation, profiling, dispatch checks, run --compare, optimize, benchmarks) can use it
without pulling in anything else of modulelens.

* :class:`Timing` - the record of one side's samples (median, p20/p80, runs, timer, threads);
* :func:`time_callable` - one callable alone (``profile``, bandwidth);
* :func:`measure_speedup` / :func:`measure_speedups` - a base against candidates in interleaved
  paired rounds, each side a :class:`Side` (a contained process, or a :class:`CallableSide` in
  this process), giving a :class:`SpeedupMeasurement`: ``status`` ok/undetermined, ``speedup``
  (null when undetermined), 95% ``interval``, ``reason``, threads and why, ``method``;
* :func:`estimate_ratio` / :func:`decide` - the estimator and the decision on per-round ratios
  (for callers that pair rounds themselves, like ``run --compare``);
* :class:`TreeClock` - the CPU-time clock of a side's whole process tree (:mod:`.cputime`),
  beside the wall clock: it may decide when the wall-clock rounds were descheduled;
* :mod:`.noise` - the detectors; :mod:`.threads` - the thread policy (:func:`choose_threads`).
"""

from modulelens.timing.callables import CallableSide
from modulelens.timing.cputime import TreeClock
from modulelens.timing.estimate import (
    RatioEstimate,
    decide,
    estimate_ratio,
    median_interval,
    round_ratios,
    surely_above_one,
)
from modulelens.timing.interleaved import (
    MeasurementDetail,
    Probe,
    Side,
    SpeedupMeasurement,
    TimingPlan,
    measure_speedup,
    measure_speedups,
    measurement_from_rounds,
)
from modulelens.timing.noise import Finding
from modulelens.timing.samples import Timing, percentile, time_callable
from modulelens.timing.threads import ThreadChoice, choose_threads, fewer_threads, thread_choice, user_threads

__all__ = ["CallableSide", "Finding", "MeasurementDetail", "Probe", "RatioEstimate", "Side", "SpeedupMeasurement", "ThreadChoice",
           "Timing", "TimingPlan", "TreeClock", "choose_threads", "decide", "estimate_ratio", "fewer_threads", "measure_speedup",
           "measure_speedups", "measurement_from_rounds", "median_interval", "percentile", "round_ratios", "surely_above_one", "thread_choice", "time_callable",
           "user_threads"]
