"""Interleaved paired timing: a base (eager, or the run without a pack) against one or more
candidates, by one clock, in many short rounds, until the speedup's 95% interval is narrow
enough or the time budget ends.

A :class:`Side` is anything that runs ``calls`` calls when asked and says how long that took by
the *caller's* clock: a contained process timed around a request (validation), or a callable in
this process (``check_pack``, :class:`CallableSide`). :func:`measure_speedups` drives them:

1. **Calibration**: every side runs the same number of calls per batch, chosen so that the slowest
   side's batch lasts about ``batch_s``. A batch carries a fixed cost (a pipe round trip, the
   outputs copied back, a synchronisation) that is the same on every side; with equal call counts
   it adds the same time per call to each side, which can only pull a ratio towards 1, never
   away from it: a speedup is understated by at most that cost over the faster side's batch,
   and a slowdown is never turned into a speedup. (Equal batch *durations* would cancel the cost
   exactly, but only if the durations match: calibrated on a busy machine they do not, and the
   mismatch biased ratios either way by 30-60% in our measurements.) Calls are recalibrated
   after the 2nd and 4th rounds from the median per-call times.
2. **Rounds** in mirrored order (base, c1, .., ck, ck, .., c1, base, and the other way round in
   the next round; ABBA for one candidate), so linear drift within a round hits every side alike.
   While one side is timed the others are *held* (a process side is stopped with SIGSTOP), so a
   candidate cannot slow the base down from a background thread.
3. **Same CPUs, disturbance**: every side is pinned to the same CPUs (the quietest ones when the
   measurement starts), so a side never gains from landing on a less busy CPU than the other.
   Around every batch the run-queue wait and involuntary context switches of the measured
   processes (and this one), and the hypervisor's steal time of the pinned CPUs, are read from
   ``/proc`` (:func:`~modulelens.timing.noise.sched_counters`). A round's figure for a side is
   the faster of its two batches, preferring undisturbed ones (a preempted batch is slower, never
   faster); a round is *clean* for a candidate when both it and the base had an undisturbed
   batch. When :data:`CLEAN_ENOUGH` clean rounds exist, only those count. Otherwise all rounds
   count: with one thread per side, preemption hits both sides of a round alike and the median
   of paired ratios stands up to it; with more threads, a descheduled worker stalls a whole
   parallel region of whichever side is running, so a mostly preempted multi-threaded measurement
   is undetermined (the retime below tries one with fewer threads first).
4. **Estimate** (:mod:`~modulelens.timing.estimate`): the median of the per-round ratios with its
   order-statistics 95% interval; rounds continue until it is narrower than ``target_width`` or
   the budget ends.
5. **Retime policy**: at half the budget, when a candidate is still undetermined and the rounds
   were preempted (or batches lost scheduler ticks), the measurement starts over with half the
   threads (both sides), a descheduled worker thread being what turns a call into a scheduler
   tick, and runs rounds for the rest of the budget. The report says so.
6. **Verdict**: ``ok`` with the point and interval, or ``undetermined`` (the speedup is null)
   with the interval and the reason: too few rounds, too wide, straddling 1, two modes, or too
   few undisturbed rounds on a preempted machine.
7. **Clocks**: a side may carry a CPU-time clock of its whole process tree (``cpu_clock``, a
   :class:`~modulelens.timing.cputime.TreeClock`: validation's contained processes do). When the
   wall-clock rounds fail the noise checks with descheduling among the findings (preempted
   batches, lost time slices, load), or a side's batches used more CPUs than its threads, the
   same estimate and decision run on the CPU-time rounds (single-threaded sides whose trees are
   known complete, no work hidden from the clock; two modes and drift still block), and the
   result says which clock decided and why (``clock``, ``clock_why``). When one side is PID 1 of
   its own namespace and single-threaded, a preempted first attempt is not started over: the CPU
   clock answers preemption.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from pydantic import BaseModel, Field

from modulelens.device import is_cuda
from modulelens.timing import noise
from modulelens.timing.cputime import TreeClock
from modulelens.timing.estimate import MIN_ROUNDS, decide, estimate_ratio, round_ratios
from modulelens.timing.samples import Timing, percentile
from modulelens.timing.threads import ThreadChoice, fewer_threads

_perf_counter = time.perf_counter  # taken at import, before any candidate code could run here
CLEAN_ENOUGH = 8  # undisturbed rounds that are enough to use them alone


class Side(Protocol):
    """One side of a comparison. ``prepare`` readies a batch (inputs written: not timed, not
    watched), ``batch`` runs ``calls`` calls (round ``round_index``: the n-th batches of the sides
    in one round see the same input values, two batches of one side never do; calibration
    batches have negative indices) and returns their wall seconds by the caller's clock; ``pids`` are the
    processes doing the work (their scheduler counters are read); ``hold``/``release`` stop and
    resume it while another side is timed; ``set_threads`` sets its intra-op thread count;
    ``timer`` says in words how it is timed."""

    label: str
    timer: str
    device: str

    def prepare(self, calls: int, round_index: int) -> None: ...

    def batch(self, calls: int, round_index: int) -> float: ...

    def pids(self) -> list[int]: ...

    def hold(self) -> None: ...

    def release(self) -> None: ...

    def set_threads(self, threads: int) -> None: ...


class TimingPlan(BaseModel):
    """How long and how finely to measure."""

    min_seconds: float = Field(0.3, gt=0, description="Rounds run at least this long.")
    budget_s: float = Field(3.0, gt=0, description="Rounds stop at this many seconds, determined or not.")
    target_width: float = Field(0.2, gt=0, description="Stop once (high - low) / point of the 95% interval is below this.")
    batch_s: float = Field(0.01, gt=0, description="Seconds the slowest side's batch lasts (every side runs as many calls).")
    warmup_batches: int = Field(2, ge=0)
    max_calls: int = Field(20_000, ge=1, description="Most calls in one batch.")


class MeasurementDetail(BaseModel):
    """What a speedup's measurement saw: rounds, disturbance, threads, findings (a report keeps
    this; the method and why those threads are in its one-line note)."""

    rounds: int = Field(0, description="Rounds the estimate uses.")
    clean_rounds: int = Field(0, description="Rounds in which neither side's process was preempted.")
    batches: int = 0
    disturbed_batches: int = 0
    threads: int = Field(1, description="Intra-op threads of both sides.")
    retimed: bool = Field(False, description="The first attempt was disturbed and the rounds were started over.")
    findings: list[noise.Finding] = Field(default_factory=list)
    clock: Literal["wall", "cpu"] = Field("wall", description="The clock whose rounds decided: wall time, or the CPU "
                                          "time of each side's process tree (when the wall rounds were descheduled).")
    clock_why: str = Field("", description="Why that clock decided (or why neither did), in one sentence.")


class SpeedupMeasurement(MeasurementDetail):
    """A speedup ``base time / candidate time`` with its 95% interval, or ``undetermined``, and
    how it was measured."""

    threads_why: str = ""
    method: str = Field("", description="How it was measured, in one line.")
    status: Literal["ok", "undetermined"]
    speedup: float | None = Field(None, description="The median of the per-round ratios; null when undetermined.")
    interval: list[float] | None = Field(None, description="95% interval [low, high]; null without enough rounds, "
                                         "and null when the ratio is undetermined with noise findings (then see "
                                         "``ratio_range``).")
    ratio_range: list[float] | None = Field(None, description="Smallest and largest round ratio, given instead of an "
                                            "interval when the rounds failed the noise checks: not a 95% interval.")
    reason: str = Field(description="Why it is or is not determined, in one sentence.")
    base: Timing | None = None
    candidate: Timing | None = None
    seconds: float = 0.0

    @property
    def lower(self) -> float | None:
        """The interval's lower bound: what decisions use."""
        return self.interval[0] if self.interval else None

    def detail(self, findings: int = 4) -> MeasurementDetail:
        """What it saw, without the figures (a report holds those in its own fields): at most
        ``findings`` findings, blocking ones first."""
        detail = MeasurementDetail.model_validate(self.model_dump(include=set(MeasurementDetail.model_fields)))
        detail.findings = sorted(detail.findings, key=lambda f: not f.blocking)[:findings]
        return detail

    def note(self, what: str) -> str:
        """One line: what was timed, how, with which threads, and why it is or is not determined."""
        verdict = (f"{self.speedup:.3g}x" if self.status == "ok" and self.speedup is not None else "undetermined")
        why = self.reason.split(" (", 1)[0]  # the findings are in the reason and the findings list
        by = "; decided by CPU time" if self.clock == "cpu" else ""
        return f"{what}: {self.method}; {self.threads} thread(s) ({self.threads_why}){by}; {verdict}: {why}"


@dataclass
class _Batch:
    side: int
    round: int
    calls: int
    seconds: float
    disturbed: bool
    cpu: float | None = None  # CPU seconds of the side's process tree (None: no CPU clock)


@dataclass
class _Attempt:
    threads: ThreadChoice
    batch_s: float
    calls: int = 1
    batches: list[_Batch] = field(default_factory=list)
    rounds: int = 0


@dataclass
class Probe:
    """Where the driver touches the system: scheduler counters of processes (and steal time of
    CPUs), the machine's load, the quietest CPUs, and pinning threads to CPUs (all replaced by
    fakes in tests). ``watch``: processes whose counters count besides the measured side's."""

    counters: Callable[[list[int], list[int]], noise.SchedCounters] = noise.sched_counters
    load: Callable[[], tuple[float, int]] = noise.machine_load
    quietest: Callable[[int], list[int]] = noise.quietest_cpus
    pin: Callable[[list[int], list[int]], None] = noise.pin_threads
    watch: list[int] = field(default_factory=list)
    cpus: list[int] = field(default_factory=list)


def _cpu_clock(side: Side) -> TreeClock | None:
    """The side's CPU-time clock (``cpu_clock``: a :class:`~modulelens.timing.cputime.TreeClock`
    that its ``batch`` starts and stops around the timed request), None for a side without one."""
    return getattr(side, "cpu_clock", None)


def _timed(side: Side, others: list[Side], calls: int, round_index: int,
           probe: Probe) -> tuple[float, bool, float | None]:
    side.prepare(calls, round_index)
    probe.pin(side.pids(), probe.cpus)
    for o in others:
        o.hold()
    try:
        pids = list(dict.fromkeys(side.pids() + probe.watch))
        before = probe.counters(pids, probe.cpus)
        seconds = side.batch(calls, round_index)
        after = probe.counters(pids, probe.cpus)
    finally:
        for o in others:
            o.release()
    clock = _cpu_clock(side)
    return seconds, noise.disturbed(after.since(before), seconds), clock.last_s if clock is not None else None


def _calibrate(sides: list[Side], plan: TimingPlan, round_index: int, probe: Probe) -> int:
    """Calls per batch for every side, so that the slowest side's batch lasts about
    ``plan.batch_s``: per side the fastest of three single calls, then the fastest of three
    batches of the size that suggests (a single call's time is mostly the round trip)."""
    per_call = []
    for i, side in enumerate(sides):
        others = sides[:i] + sides[i + 1:]
        for _ in range(plan.warmup_batches):
            _timed(side, others, 1, round_index, probe)
        one = min(_timed(side, others, 1, round_index, probe)[0] for _ in range(3))
        n = max(1, min(plan.max_calls, int(plan.batch_s / max(one, 1e-9))))
        t = min(_timed(side, others, n, round_index, probe)[0] for _ in range(3)) if n > 1 else one
        per_call.append(t / n)
    return _calls_for(max(per_call), plan)


def _calls_for(per_call: float, plan: TimingPlan) -> int:
    return max(1, min(plan.max_calls, int(round(plan.batch_s / max(per_call, 1e-9)))))


def _recalibrated(attempt: _Attempt, plan: TimingPlan, sides: int) -> int:
    """Calls per batch from the slowest side's median per-call time in the rounds so far."""
    medians = [statistics.median(b.seconds / b.calls for b in attempt.batches if b.side == i)
               for i in range(sides) if any(b.side == i for b in attempt.batches)]
    return _calls_for(max(medians), plan) if medians else attempt.calls


def _order(k: int, round_index: int) -> list[int]:
    """Mirrored order of sides 0..k for one round (0 is the base)."""
    forward = list(range(k + 1)) if round_index % 2 == 0 else [*range(1, k + 1), 0]
    return forward + forward[::-1]


def _per_round(attempt: _Attempt, side: int) -> dict[int, tuple[float, bool]]:
    """round -> (per-call seconds, undisturbed): the faster undisturbed batch, else the faster."""
    out: dict[int, tuple[float, bool]] = {}
    for b in attempt.batches:
        if b.side != side:
            continue
        value, clean = b.seconds / b.calls, not b.disturbed
        have = out.get(b.round)
        if have is None or (clean and not have[1]) or (clean == have[1] and value < have[0]):
            out[b.round] = (value, clean)
    return out


@dataclass
class _Pairs:
    base: list[float]
    cand: list[float]
    clean: int
    used_clean_only: bool


def _pairs(attempt: _Attempt, j: int) -> _Pairs:
    base, cand = _per_round(attempt, 0), _per_round(attempt, j)
    rounds = sorted(set(base) & set(cand))
    clean = [r for r in rounds if base[r][1] and cand[r][1]]
    use = clean if len(clean) >= CLEAN_ENOUGH else rounds
    return _Pairs([base[r][0] for r in use], [cand[r][0] for r in use], len(clean), use is clean)


def _findings(attempt: _Attempt, j: int, pairs: _Pairs, ratios: list[float], probe: Probe) -> list[noise.Finding]:
    found: list[noise.Finding] = []
    for side, who in ((0, "base side: "), (j, "candidate side: ")):
        mine = [b for b in attempt.batches if b.side == side]
        f = noise.tick_quantised([b.seconds for b in mine], [b.calls for b in mine], who=who)
        if f:
            found.append(f)
    mine = [b for b in attempt.batches if b.side in (0, j)]
    f = noise.preempted([b.disturbed for b in mine])
    if f:
        if not pairs.used_clean_only and attempt.threads.threads > 1:
            # a descheduled worker thread stalls a whole parallel region of whichever side runs
            f.blocking = True
            f.detail += f" with {attempt.threads.threads} threads a side, {pairs.clean} round(s) undisturbed"
        found.append(f)
    for f in (noise.bimodal(ratios), noise.rounds_disagree(ratios), noise.overloaded(*probe.load())):
        if f:
            found.append(f)
    return found


def _timing(values: list[float], calls: int, timer: str, device: str, threads: int, warmup: int) -> Timing:
    return Timing(median_s=statistics.median(values), p20_s=percentile(values, 0.2), p80_s=percentile(values, 0.8),
                  runs=calls, samples=len(values), warmup=warmup, timer=timer, device=device,
                  threads=threads, cache="warm (caches are not flushed between calls)"
                  if not is_cuda(device) else "cold L2 (flushed before every batch)")


def _decided(est: Any, target_width: float, found: list[noise.Finding],
             ratios: list[float]) -> tuple[bool, str, list[float] | None]:
    """:func:`decide`, the findings added to the reason of an undetermined ratio (blocking first),
    and the interval it may report as 95%.

    Honest labels: an undetermined ratio with noise findings (descheduled batches, load, two
    modes, drift) comes from rounds that are not independent draws of one distribution, so its
    order-statistics interval is not a 95% interval. It then reports no interval (null) and the
    reason gives the range of round ratios, labelled as such. A determined ratio passed the
    blocking checks; one undetermined on a quiet machine (too few rounds, too wide) keeps its
    95% interval."""
    ok, reason = decide(est, target_width, [f.detail for f in found if f.blocking])
    interval = [est.low, est.high] if est.low is not None and est.high is not None else None
    if not ok and found and ratios:
        interval = None
        reason = (f"range of round ratios {min(ratios):.3g}x..{max(ratios):.3g}x over {len(ratios)} round(s), "
                  f"not a 95% interval: the rounds failed the noise checks")
    if not ok:  # the two findings that matter most (blocking first); all of them stay in ``findings``
        context = [f.detail for f in sorted(found, key=lambda f: not f.blocking) if f.detail not in reason][:2]
        if context:
            reason += " (" + "; ".join(context) + ")"
    return ok, reason, interval


def _ratio_range(ok: bool, interval: list[float] | None, ratios: list[float]) -> list[float] | None:
    """The smallest and largest round ratio where :func:`_decided` withheld the interval."""
    return [min(ratios), max(ratios)] if not ok and interval is None and ratios else None


DESCHEDULED = ("preempted", "tick", "load")  # findings of time lost waiting for a CPU: what CPU time does not count


def _cpu_per_round(attempt: _Attempt, side: int) -> dict[int, float] | None:
    """round -> the faster batch's CPU seconds per call (None when a batch has no CPU reading)."""
    out: dict[int, float] = {}
    for b in attempt.batches:
        if b.side != side:
            continue
        if b.cpu is None:
            return None
        value = b.cpu / b.calls
        out[b.round] = min(value, out.get(b.round, value))
    return out


def _clock_findings(sides: list[Side], j: int, threads: int) -> tuple[list[noise.Finding], list[noise.Finding],
                                                                      str | None]:
    """What the CPU-time clocks of the base and candidate saw (:meth:`TreeClock.findings`):
    (blocking both clocks, blocking the wall clock, why the CPU clock may not decide or None)."""
    both: list[noise.Finding] = []
    wall: list[noise.Finding] = []
    why = None if threads == 1 else f"{threads} threads a side (CPU time would count idle pool threads spinning)"
    if is_cuda(sides[0].device) or is_cuda(sides[j].device):
        why = "GPU work: the CPU time of a process waiting on the device says nothing of the kernel"
    for i, who in ((0, "base side: "), (j, "candidate side: ")):
        clock = _cpu_clock(sides[i])
        if clock is None:
            why = why or f"{who}no CPU-time clock"
            continue
        if not clock.complete:
            why = why or f"{who}{clock.why}"
        b, w = clock.findings(who, threads)
        both += b
        wall += w
    return both, wall, why


def _cpu_decision(attempt: _Attempt, j: int, plan: TimingPlan, both: list[noise.Finding]) -> tuple[
        bool, str, list[float] | None, Any, list[float], list[float], list[float], list[noise.Finding]]:
    """The same estimate and decision on the CPU-time rounds: (ok, reason, interval, estimate,
    ratios, base per call, candidate per call, findings). Two modes and drift still block: CPU
    time cannot subtract a neighbour's memory-bandwidth or cache pressure."""
    base, cand = _cpu_per_round(attempt, 0) or {}, _cpu_per_round(attempt, j) or {}
    rounds = sorted(set(base) & set(cand))
    b, c = [base[r] for r in rounds], [cand[r] for r in rounds]
    ratios = round_ratios(b, c)
    est = estimate_ratio(ratios)
    found = both + [f for f in (noise.bimodal(ratios), noise.rounds_disagree(ratios)) if f]
    ok, reason, interval = _decided(est, plan.target_width, found, ratios)
    return ok, reason, interval, est, ratios, b, c, found


def _measurement(attempt: _Attempt, sides: list[Side], j: int, plan: TimingPlan, retimed: bool,
                 seconds: float, retime_why: str, probe: Probe) -> SpeedupMeasurement:
    """One candidate's result: the wall-clock rounds decide when they pass the noise checks; when
    they were judged noisy by descheduling (and the CPU clocks are complete, single-threaded and
    clean), the CPU-time rounds may decide instead. The result says which clock and why."""
    pairs = _pairs(attempt, j)
    ratios = round_ratios(pairs.base, pairs.cand)
    est = estimate_ratio(ratios)
    both, wall_only, cpu_barred = _clock_findings(sides, j, attempt.threads.threads)
    found = _findings(attempt, j, pairs, ratios, probe) + both + wall_only
    ok, reason, interval = _decided(est, plan.target_width, found, ratios)
    mine = [b for b in attempt.batches if b.side in (0, j)]
    calls = attempt.calls
    threads = attempt.threads.threads
    what = (f"{len(ratios)} {'undisturbed ' if pairs.used_clean_only else ''}rounds of "
            f"{'ABBA' if len(sides) == 2 else 'mirrored'} batches of {calls} call(s) each side, "
            f"timed by {sides[0].timer}" + (f"; {retime_why}" if retimed else ""))
    point, clock, clock_why = est.point, "wall", "the wall-clock rounds passed the noise checks"
    base_s, cand_s, timer = pairs.base, pairs.cand, (sides[0].timer, sides[j].timer)
    desched = [f.detail for f in found if f.kind in DESCHEDULED]
    if not ok:
        clock_why = "the wall-clock rounds failed the noise checks"
        desched += [f.detail for f in wall_only]  # more CPUs than allowed: CPU time counts them all
        if not desched:
            clock_why += " for other reasons than descheduling: CPU time was not tried"
        elif cpu_barred:
            clock_why += f" (descheduled); CPU time could not decide: {cpu_barred}"
        elif any(f.kind in ("outside", "unseen") for f in both):
            clock_why += "; CPU time could not decide: work was hidden from it"
        else:
            c_ok, c_reason, c_interval, c_est, c_ratios, c_base, c_cand, c_found = _cpu_decision(
                attempt, j, plan, both)
            if c_ok:
                ok, reason, interval, point, clock = True, f"CPU time: {c_reason}", c_interval, c_est.point, "cpu"
                found = found + [f for f in c_found if f not in found]
                ratios, base_s, cand_s = c_ratios, c_base, c_cand
                cpu_timer = (f"CPU time of its process tree ({_cpu_clock(sides[0]).why}), read by the checker "  # type: ignore[union-attr]
                             "from /proc around each batch's request")
                timer = (cpu_timer, cpu_timer)
                clock_why = (f"the wall-clock rounds were descheduled or used more CPUs than allowed ({desched[0]}); "
                             "the CPU time of each side's process tree counts neither time spent waiting for a CPU "
                             "nor makes work on other CPUs free")
            else:
                clock_why += f" (descheduled), and so did the CPU-time rounds: {c_reason}"
                reason += f"; CPU time: {c_reason}"
    return SpeedupMeasurement(
        status="ok" if ok else "undetermined", speedup=point if ok else None,
        interval=interval, ratio_range=_ratio_range(ok, interval, ratios),
        reason=reason, rounds=len(ratios), clean_rounds=pairs.clean, batches=len(mine),
        disturbed_batches=sum(b.disturbed for b in mine), threads=threads,
        threads_why=attempt.threads.why, retimed=retimed, method=what, findings=found, clock=clock,
        clock_why=clock_why,
        base=_timing(base_s, calls * len(base_s), timer[0], sides[0].device, threads,
                     plan.warmup_batches) if base_s else None,
        candidate=_timing(cand_s, calls * len(cand_s), timer[1], sides[j].device,
                          threads, plan.warmup_batches) if cand_s else None,
        seconds=seconds)


def _settled(attempt: _Attempt, k: int, plan: TimingPlan, probe: Probe) -> bool:
    """Every candidate's ratio is determined now (blocking findings included)."""
    for j in range(1, k + 1):
        pairs = _pairs(attempt, j)
        ratios = round_ratios(pairs.base, pairs.cand)
        blocking = [f.detail for f in _findings(attempt, j, pairs, ratios, probe) if f.blocking]
        if not decide(estimate_ratio(ratios), plan.target_width, blocking)[0]:
            return False
    return True


def _cpu_answers(sides: list[Side], attempt: _Attempt) -> bool:
    """Single-threaded sides with complete CPU-time clocks: preemption is what that clock does not
    count, so starting the rounds over would only throw half of them away."""
    clocks = [_cpu_clock(s) for s in sides]
    return attempt.threads.threads == 1 and all(c is not None and c.complete for c in clocks)


def _should_retime(attempt: _Attempt, k: int) -> str | None:
    """Why the first attempt calls for a retime (None: it does not)."""
    mine = attempt.batches
    f = noise.preempted([b.disturbed for b in mine])
    if f:
        return f.detail
    for side in range(k + 1):
        b = [x for x in mine if x.side == side]
        f = noise.tick_quantised([x.seconds for x in b], [x.calls for x in b])
        if f:
            return f.detail
    return None


def measure_speedups(base: Side, candidates: list[Side], plan: TimingPlan, threads: ThreadChoice, *,
                     clock: Callable[[], float] = _perf_counter, probe: Probe | None = None,
                     on_round: Callable[[int], Any] | None = None) -> list[SpeedupMeasurement]:
    """The speedup of each candidate over ``base`` (see the module docstring), measured together
    in mirrored rounds. ``probe.watch``: more processes whose preemption disturbs a batch (this
    process, whose clock is used, is always watched). ``on_round`` is called after every round
    (a validator checks the outputs of timed batches there)."""
    import os

    sides = [base, *candidates]
    probe = probe or Probe()
    probe = Probe(probe.counters, probe.load, probe.quietest, probe.pin, [os.getpid(), *probe.watch])
    start = clock()
    attempt = _Attempt(threads=threads, batch_s=plan.batch_s)
    for s in sides:
        s.set_threads(threads.threads)
    probe.cpus = probe.quietest(threads.threads)
    own = _affinity()
    try:
        return _rounds(sides, plan, probe, attempt, clock, start, on_round)
    finally:
        if own is not None:  # an in-process side pinned this process: give it its CPUs back
            probe.pin([os.getpid()], own)


def _affinity() -> list[int] | None:
    import os

    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def _rounds(sides: list[Side], plan: TimingPlan, probe: Probe, attempt: _Attempt, clock: Callable[[], float],
            start: float, on_round: Callable[[int], Any] | None) -> list[SpeedupMeasurement]:
    candidates = sides[1:]
    retimed, retime_why = False, ""
    attempt.calls = _calibrate(sides, plan, -1, probe)  # calibration rounds are numbered apart from the rounds
    round_index = 0
    while True:
        for i in _order(len(candidates), round_index):
            others = sides[:i] + sides[i + 1:]
            seconds, dist, cpu = _timed(sides[i], others, attempt.calls, round_index, probe)
            attempt.batches.append(_Batch(i, round_index, attempt.calls, seconds, dist, cpu))
        attempt.rounds += 1
        if attempt.rounds in (2, 4):
            attempt.calls = _recalibrated(attempt, plan, len(sides))
        if on_round is not None:
            on_round(round_index)
        round_index += 1
        spent = clock() - start
        if spent >= plan.budget_s:
            break
        if spent < plan.min_seconds or attempt.rounds < MIN_ROUNDS:
            continue
        if _settled(attempt, len(candidates), plan, probe):
            break
        if not retimed and spent >= plan.budget_s / 2 and not _cpu_answers(sides, attempt):
            why = _should_retime(attempt, len(candidates))
            if why:
                before = attempt.threads
                fewer = fewer_threads(before, why) or before
                attempt = _Attempt(threads=fewer, batch_s=plan.batch_s)
                for s in sides:
                    s.set_threads(fewer.threads)
                probe.cpus = probe.quietest(fewer.threads)
                attempt.calls = _calibrate(sides, plan, -2, probe)
                retimed = True
                retime_why = (f"retimed with {fewer.threads} thread(s) because {why}" if fewer is not before
                              else f"rounds started over because {why}")
    seconds = clock() - start
    return [_measurement(attempt, sides, j, plan, retimed, seconds, retime_why, probe) for j in range(1, len(sides))]


def measure_speedup(base: Side, candidate: Side, plan: TimingPlan, threads: ThreadChoice,
                    **kw: Any) -> SpeedupMeasurement:
    """:func:`measure_speedups` for one candidate (ABBA rounds)."""
    return measure_speedups(base, [candidate], plan, threads, **kw)[0]


def measurement_from_rounds(base_s: list[float], candidate_s: list[float], *, target_width: float, method: str,
                            threads: ThreadChoice, timer: str, device: str = "cpu") -> SpeedupMeasurement:
    """A :class:`SpeedupMeasurement` from rounds the caller paired itself (``run --compare``
    switches a pack on and off between a script's steps): per-round times of the base and the
    candidate, the same estimator, detectors of the rounds and decision as :func:`measure_speedups`."""
    ratios = round_ratios(base_s, candidate_s)
    est = estimate_ratio(ratios)
    found = [f for f in (noise.bimodal(ratios), noise.rounds_disagree(ratios), noise.overloaded(*noise.machine_load()))
             if f]
    ok, reason, interval = _decided(est, target_width, found, ratios)
    return SpeedupMeasurement(
        status="ok" if ok else "undetermined", speedup=est.point if ok else None,
        interval=interval, ratio_range=_ratio_range(ok, interval, ratios), reason=reason,
        rounds=len(ratios), threads=threads.threads, threads_why=threads.why, method=method, findings=found,
        base=_timing(base_s, len(base_s), timer, device, threads.threads, 0) if base_s else None,
        candidate=_timing(candidate_s, len(candidate_s), timer, device, threads.threads, 0) if candidate_s else None)
