"""What breaks a measurement, detected from the samples and from what the kernel counts.

Each detector is a pure function of numbers (unit-tested on synthetic samples) that returns a
:class:`Finding` or None:

* :func:`tick_quantised` - batches that ran a scheduler tick (or more) longer than the fastest:
  a thread of the measured process was descheduled for a time slice;
* :func:`bimodal` - per-round ratios in two separated groups: two answers, neither trustworthy;
* :func:`rounds_disagree` - per-round ratios scattered widely, or drifting between the first and
  the second half of the rounds;
* :func:`preempted` - the share of batches during which the measured processes waited on a run
  queue or were switched out involuntarily (read from ``/proc``, see :func:`sched_counters`);
* :func:`overloaded` - the 1-minute load average above the number of cores.

The readers (:func:`sched_counters`, :func:`machine_load`) are the only parts that touch the system.
"""

from __future__ import annotations

import math
import os
import statistics
from pathlib import Path

from pydantic import BaseModel, Field

DEFAULT_TICK_S = 0.004  # Linux's common CONFIG_HZ=250; a descheduled thread loses about a slice of this order
DISTURBED_WAIT_SHARE = 0.02  # a batch whose processes waited on a run queue this share of its time is disturbed


class Finding(BaseModel):
    kind: str = Field(description="tick, bimodal, disagree, drift, preempted or load.")
    detail: str = Field(description="What was seen, in words.")
    blocking: bool = Field(False, description="No figure from these samples can be trusted, however narrow its interval.")


def tick_quantised(batch_s: list[float], calls: list[int], tick_s: float = DEFAULT_TICK_S,
                   share: float = 0.2, who: str = "") -> Finding | None:
    """Batches (``batch_s`` seconds for ``calls`` calls each) that took at least half a tick
    longer than the fastest batch's per-call time predicts, in at least ``share`` of batches
    (``who``: whose batches, for the detail)."""
    if len(batch_s) < 5:
        return None
    best = min(s / n for s, n in zip(batch_s, calls) if n > 0)
    slow = sum(1 for s, n in zip(batch_s, calls) if s - best * n >= tick_s / 2)
    if slow / len(batch_s) < share:
        return None
    return Finding(kind="tick", detail=f"{who}{slow}/{len(batch_s)} batches {tick_s / 2 * 1e3:.0f}+ ms over the fastest "
                   "(descheduled for a time slice)")


def _split_separation(xs: list[float], floor: float) -> tuple[float, float, int]:
    """(best Ashman's D, gap between the two group means, split index) over splits of sorted
    ``xs`` that leave at least a fifth of the values in each group."""
    n = len(xs)
    best = (0.0, 0.0, 0)
    for m in range(max(2, math.ceil(0.2 * n)), min(n - 2, math.floor(0.8 * n)) + 1):
        lo, hi = xs[:m], xs[m:]
        s1, s2 = max(statistics.pstdev(lo), floor), max(statistics.pstdev(hi), floor)
        gap = statistics.fmean(hi) - statistics.fmean(lo)
        d = math.sqrt(2) * gap / math.sqrt(s1 * s1 + s2 * s2)
        if d > best[0]:
            best = (d, gap, m)
    return best


def bimodal(ratios: list[float], min_gap: float = 0.2, min_separation: float = 3.0) -> Finding | None:
    """Per-round ratios that fall in two groups (each at least a fifth of the rounds) whose
    means differ by more than ``min_gap`` (relative) and are separated by Ashman's D above
    ``min_separation`` (computed on logarithms, with a 2% floor on each group's spread)."""
    if len(ratios) < 10 or min(ratios) <= 0:
        return None
    logs = sorted(math.log(r) for r in ratios)
    d, gap, m = _split_separation(logs, floor=0.02)
    if d < min_separation or gap < math.log1p(min_gap):
        return None
    low, high = math.exp(statistics.median(logs[:m])), math.exp(statistics.median(logs[m:]))
    return Finding(kind="bimodal", blocking=True,
                   detail=f"two groups of rounds ({m} near {low:.3g}x, {len(logs) - m} near {high:.3g}x)")


def rounds_disagree(ratios: list[float], max_spread: float = 0.5, max_drift: float = 0.25) -> Finding | None:
    """Rounds whose middle half spans more than ``max_spread`` of the median, or whose first and
    second halves have medians more than ``max_drift`` apart (relative)."""
    if len(ratios) < 8:
        return None
    qs = statistics.quantiles(ratios, n=4)
    med = statistics.median(ratios)
    spread = (qs[2] - qs[0]) / med if med > 0 else math.inf
    if spread > max_spread:
        return Finding(kind="disagree", detail=f"rounds disagree (middle half {qs[0]:.3g}x..{qs[2]:.3g}x)")
    half = len(ratios) // 2
    first, second = statistics.median(ratios[:half]), statistics.median(ratios[half:])
    if abs(first - second) / med > max_drift:
        # blocking: drift is what a neighbour's changing memory-bandwidth or cache pressure does to the
        # ratio, which no clock (wall or CPU time) can subtract, so no figure from these rounds is trusted
        return Finding(kind="drift", blocking=True, detail=f"the ratio drifted from {first:.3g}x to {second:.3g}x")
    return None


def preempted(disturbed: list[bool], share: float = 0.3) -> Finding | None:
    """At least ``share`` of the batches were disturbed (their processes waited on a run queue or
    were switched out involuntarily)."""
    if not disturbed:
        return None
    hit = sum(disturbed)
    if hit / len(disturbed) < share:
        return None
    return Finding(kind="preempted", detail=f"{hit}/{len(disturbed)} batches preempted (waited for a CPU)")


def overloaded(load1: float, cores: int) -> Finding | None:
    """The 1-minute load average is above the number of usable cores."""
    if load1 <= cores:
        return None
    return Finding(kind="load", detail=f"load {load1:.1f} on {cores} cores")


# -- readers ------------------------------------------------------------------------------------

class SchedCounters(BaseModel):
    """Scheduler counters summed over every thread of some processes (from ``/proc``), and the
    time a hypervisor stole from the CPUs they are pinned to."""

    wait_ns: int = Field(0, description="Nanoseconds runnable but waiting on a run queue (schedstat).")
    involuntary: int = Field(0, description="Involuntary context switches (status).")
    steal_ticks: int = Field(0, description="Steal time of the pinned CPUs, in USER_HZ ticks (/proc/stat).")

    def since(self, before: SchedCounters) -> SchedCounters:
        return SchedCounters(wait_ns=self.wait_ns - before.wait_ns, involuntary=self.involuntary - before.involuntary,
                             steal_ticks=self.steal_ticks - before.steal_ticks)


def _threads(pid: int) -> list[str]:
    """The thread ids of process ``pid`` (none when it is gone or unreadable)."""
    try:
        return os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []


def _cpu_times() -> dict[int, list[int]]:
    """Per-CPU counters of /proc/stat (user nice system idle iowait irq softirq steal ...)."""
    out: dict[int, list[int]] = {}
    try:
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("cpu") and line[3:4].isdigit():
                name, *fields = line.split()
                out[int(name[3:])] = [int(x) for x in fields]
    except (OSError, ValueError):
        pass
    return out


def sched_counters(pids: list[int], cpus: list[int] | None = None) -> SchedCounters:
    """Run-queue wait and involuntary switches of every thread of ``pids``, read from
    ``/proc/PID/task/*/schedstat`` and ``status`` (written by the kernel; a process cannot forge
    them), and the steal time of ``cpus``. Threads that vanish while being read, and unreadable
    files, count as zero."""
    wait = invol = 0
    steal = 0
    if cpus:
        times = _cpu_times()
        steal = sum(times[c][7] for c in cpus if c in times and len(times[c]) > 7)
    for pid in pids:
        for tid in _threads(pid):
            base = Path(f"/proc/{pid}/task/{tid}")
            try:
                wait += int((base / "schedstat").read_text().split()[1])
            except (OSError, IndexError, ValueError):
                pass
            try:
                for line in (base / "status").read_text().splitlines():
                    if line.startswith("nonvoluntary_ctxt_switches:"):
                        invol += int(line.split()[1])
            except (OSError, ValueError):
                pass
    return SchedCounters(wait_ns=wait, involuntary=invol, steal_ticks=steal)


def disturbed(delta: SchedCounters, seconds: float, wait_share: float = DISTURBED_WAIT_SHARE) -> bool:
    """Whether a batch of ``seconds`` with counter changes ``delta`` was disturbed: an
    involuntary switch, time stolen by a hypervisor, or run-queue waiting above ``wait_share``
    of its time."""
    return delta.involuntary > 0 or delta.steal_ticks > 0 or delta.wait_ns > wait_share * seconds * 1e9


def quietest_cpus(count: int, window_s: float = 0.05) -> list[int]:
    """The ``count`` usable CPUs that were idle the most during the next ``window_s`` seconds
    (from /proc/stat): where both sides of a measurement are pinned."""
    import time

    usable = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if not usable:
        return []
    before = _cpu_times()
    time.sleep(window_s)
    after = _cpu_times()

    def idle(c: int) -> int:
        a, b = after.get(c), before.get(c)
        return (a[3] - b[3]) if a and b and len(a) > 3 and len(b) > 3 else 0

    return sorted(sorted(usable, key=lambda c: (-idle(c), c))[:max(1, count)])


def pin_threads(pids: list[int], cpus: list[int]) -> None:
    """Pin every thread of ``pids`` to ``cpus`` (threads started later inherit it from theirs).
    Threads that vanish or refuse are left as they are."""
    if not cpus or not hasattr(os, "sched_setaffinity"):
        return
    for pid in pids:
        for tid in _threads(pid):
            try:
                os.sched_setaffinity(int(tid), cpus)
            except (OSError, ValueError):
                pass


def usable_cores() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def machine_load() -> tuple[float, int]:
    """(1-minute load average, usable cores)."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = 0.0
    return load, usable_cores()
