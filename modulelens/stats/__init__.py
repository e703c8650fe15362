"""Per-module training statistics: activation and gradient statistics on sampled steps, findings
and plots. See :class:`modulelens.stats.collector.StatsCollector` (Python API) and the
``gather_stats`` tool (CLI ``modulelens gather-stats``, MCP ``gather_stats``)."""

from modulelens.stats.collector import StatsCollector, StopRun
from modulelens.stats.stats import DEFINITIONS, tensor_stats

__all__ = ["DEFINITIONS", "StatsCollector", "StopRun", "tensor_stats"]
