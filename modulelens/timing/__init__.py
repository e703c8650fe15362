"""Timing: how long a callable takes, as a spread of samples rather than one number.

A leaf package: it imports only the standard library, torch and pydantic, so every place that
times (validation, profiling, dispatch checks, benchmarks) can use it without pulling in anything
else of modulelens.

* :class:`Timing` - the record of one measurement (median, p20/p80, samples, timer, threads, cache);
* :func:`time_callable` - one callable, with ``torch.utils.benchmark`` on CPU and CUDA events
  (L2 flushed before every call) on CUDA;
* :func:`paired_timing` - two callables timed back to back, pair after pair, with the median ratio;
* :func:`percentile` - linear-interpolated percentile of samples.
"""

from modulelens.timing.paired import paired_timing
from modulelens.timing.samples import Timing, percentile, time_callable

__all__ = ["Timing", "paired_timing", "percentile", "time_callable"]
