"""Timing inside validation: the reference and the candidate as two contained processes set up
the same way, timed by the checker's clock through the same request, and timed calls that are
checked calls.

* :class:`TimedProcess` is a :class:`~modulelens.timing.Side` over one contained process
  (:func:`~modulelens.validation.checker.start_candidate`, the :mod:`.harness`): a batch is one
  :class:`CallRequest` of ``calls`` calls timed by :func:`~modulelens.validation.checker.time_calls`.
  The reference side (the card's aten operator, the original module, torch.compile) is such a
  process too, with the same containment, thread count, arena and pipes: whatever they cost falls
  on both sides, and the candidate never shares a process (or a CPU while held) with it.
* :class:`TimingFeed` gives every round fresh input values (the same to every side of the round)
  and a fresh seed for the swaps between calls (:mod:`.perturb`), so neither a per-pointer result
  nor a cache keyed on sampled values survives from one call to the next.
* A random share (:data:`VERIFY_SHARE`, drawn by the checker *after* a batch ran, so nothing in
  the request could tell) of the candidate's timed batches has its outputs checked against the
  reference on the inputs the last call saw, and the inputs themselves checked unchanged but for
  the swaps; at least :data:`MIN_VERIFIED` per measurement. A mismatch rejects the candidate:
  "its timed outputs disagree with the reference".

What a candidate that rewrites the harness in its own process could still do (compute only the
last call of each batch) is beyond what checking outputs can see; it shows as a speedup beyond
belief (flagged, see :mod:`.plausibility`).

On CUDA, a batch ends with a device synchronisation in the harness and is timed by the checker's
clock like on CPU (CUDA events cannot be read across processes, and events recorded by the
candidate's process would be its claim); in-process comparisons (``check_pack``, the GPU
benchmark) use CUDA events and an L2 flush (:class:`~modulelens.timing.CallableSide`).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

import torch

from modulelens.sandbox import CandidateDied, CandidateProcess
from modulelens.timing import SpeedupMeasurement, Timing, TimingPlan
from modulelens.validation.checker import CandidateChecker, CandidateFailed, ModuleCall, time_calls
from modulelens.validation.compare import same_bits
from modulelens.validation.inputs import fresh_inputs
from modulelens.validation.perturb import perturbed, replay

VERIFY_SHARE = 0.25  # of the candidate's timed batches, checked after the fact
MIN_VERIFIED = 2  # timed-style batches checked per measurement at least (extra ones if the draw gave fewer)
_RANDOM = secrets.SystemRandom()

Verify = Callable[[list[torch.Tensor], list, dict, str], "str | None"]
"""(outputs, final args, final kwargs, label) -> None when right, else why not."""


class TimingFeed:
    """The inputs of timed batches: round ``r`` gets fresh values (normal, seeded by ``r``) shaped
    like ``args``/``kwargs``, and a random seed for its swaps; every side of a round gets both."""

    def __init__(self, args: list, kwargs: dict):
        self.args, self.kwargs = args, kwargs
        self._round: int | None = None
        self._values: tuple[list, dict] = (args, kwargs)
        self._seed = 0

    def round(self, r: int) -> tuple[list, dict, int]:
        if r != self._round:
            self._round = r
            self._values = fresh_inputs(self.args, self.kwargs, 104_729 + r, "normal")
            self._seed = _RANDOM.randrange(1, 1 << 62)
        return self._values[0], self._values[1], self._seed


def _arena_copy(value: Any, out: list[torch.Tensor]) -> Any:
    """``value`` with every tensor replaced by a CPU copy laid out like its arena slot (same
    strides, storage spanning exactly the slot), collected into ``out`` in encoding order."""
    if isinstance(value, torch.Tensor):
        t = value.detach()
        copy = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype)
        copy.copy_(t.cpu())
        out.append(copy)
        return copy
    if isinstance(value, (list, tuple)):
        items = [_arena_copy(v, out) for v in value]
        return tuple(items) if isinstance(value, tuple) else items
    return value


def final_inputs(args: list, kwargs: dict, seed: int, calls: int) -> tuple[list, dict, list[torch.Tensor]]:
    """The inputs the last call of a batch saw: copies of ``args``/``kwargs`` with the batch's
    swaps replayed (see :mod:`.perturb`); also the copies' tensors in encoding order."""
    flat: list[torch.Tensor] = []
    a = [_arena_copy(x, flat) for x in args]
    k = {name: _arena_copy(v, flat) for name, v in kwargs.items()}
    replay([t for t in flat if perturbed(t)], seed, calls)
    return a, k, flat


class ReferenceFailed(Exception):
    """The reference process failed: the speedup is undetermined (the candidate is not to blame)."""


class TimedProcess:
    """A :class:`~modulelens.timing.Side` over one contained process (see the module docstring).
    The candidate side has ``verify``; a side without is a reference (its failures raise
    :class:`ReferenceFailed`, a candidate's :class:`CandidateFailed`)."""

    def __init__(self, checker: CandidateChecker, proc: CandidateProcess, label: str, device: str,
                 feed: TimingFeed, want: list[torch.Tensor], module_call: ModuleCall | None = None,
                 verify: Verify | None = None, reference: bool = False):
        self.checker, self.proc, self.label, self.device = checker, proc, label, device
        self.feed, self.want, self.module_call, self.verify = feed, want, module_call, verify
        self.reference = reference
        self.timer = "the checker's clock around each batch's request to a contained process"
        self._pid: int | None = None
        self._pending: Any = None
        self.verified = 0
        self.last_calls = 1

    def _call_fields(self, calls: int, round_index: int) -> tuple[Any, list, dict, int, list]:
        args, kwargs, seed = self.feed.round(round_index)
        request, written = self.checker.encode_call(args, kwargs, self.want, False, self.module_call,
                                                    proc=self.proc, calls=calls, seed=seed)
        return request, args, kwargs, seed, [slot for slot, _ in written]

    def prepare(self, calls: int, round_index: int) -> None:
        self._pending = self._call_fields(calls, round_index)

    def batch(self, calls: int, round_index: int) -> float:
        request, args, kwargs, seed, slots = self._pending or self._call_fields(calls, round_index)
        self._pending = None
        self.last_calls = calls
        label = f"a timed batch of {calls} call(s)"
        try:
            seconds, reply = time_calls(self.proc, request, self.checker.call_timeout)
            outputs, _, _ = self.checker.read_reply(reply, label, self.proc)
        except CandidateDied as e:
            if self.reference:
                raise ReferenceFailed(f"the {self.label} reference process {e.reason} while being timed") from None
            raise CandidateFailed(f"the {self.label} process {e.reason} while being timed") from None
        except CandidateFailed as e:
            if self.reference:
                raise ReferenceFailed(f"the {self.label} reference {e}") from None
            raise
        if self.verify is not None and _RANDOM.random() < VERIFY_SHARE:
            self._check(outputs, args, kwargs, seed, calls, slots, label)
        return seconds

    def _check(self, outputs: list[torch.Tensor], args: list, kwargs: dict, seed: int, calls: int, slots: list,
               label: str) -> None:
        """The outputs of a batch against the reference on the inputs its last call saw, and
        the inputs in the arena against those (the swaps undone or anything else written fails)."""
        assert self.verify is not None
        a, k, flat = final_inputs(args, kwargs, seed, calls)
        self.verified += 1
        who = "" if self.label == "candidate" else f"{self.label}: "
        for i, (slot, want) in enumerate(zip(slots, flat)):
            if not same_bits(self.proc.arena.read(slot), want):
                raise CandidateFailed(f"{who}its timed batches change their inputs: input {i} after {label} is not "
                                      "what the checker wrote (with the swaps between calls)")
        problem = self.verify(outputs, a, k, label)
        if problem:
            raise CandidateFailed(f"{who}its timed outputs disagree with the reference: {problem}")

    def check_extra(self, round_index: int, calls: int) -> None:
        """A batch built like a timed one (fresh values, swaps), not timed, its outputs checked."""
        if self.verify is None:
            return
        request, args, kwargs, seed, slots = self._call_fields(calls, round_index)
        try:
            _, reply = time_calls(self.proc, request, self.checker.call_timeout)
        except CandidateDied as e:
            raise CandidateFailed(f"the {self.label} process {e.reason} during a checked batch") from None
        label = f"a batch of {calls} call(s) like the timed ones"
        outputs, _, _ = self.checker.read_reply(reply, label, self.proc)
        self._check(outputs, args, kwargs, seed, calls, slots, label)

    def pids(self) -> list[int]:
        if self._pid is None:
            self._pid = self.proc.candidate_pid()
        return [self._pid]

    def hold(self) -> None:
        self.proc.pause()

    def release(self) -> None:
        self.proc.resume()

    def set_threads(self, threads: int) -> None:
        from modulelens.timing import ThreadChoice

        if self.checker.threads is None or self.checker.threads.threads != threads:
            self.checker.threads = ThreadChoice(threads=threads, why=f"{threads}, set for the timing")


def settle_verification(side: TimedProcess) -> None:
    """Check extra batches (as long as the last timed one) until :data:`MIN_VERIFIED` of the
    candidate's were checked."""
    r = 1 << 20
    while side.verify is not None and side.verified < MIN_VERIFIED:
        side.check_extra(r, side.last_calls)
        r += 1


def load_reference(checker: CandidateChecker, proc: CandidateProcess, backend: str, load: Any,
                   timeout: float) -> str | None:
    """Get a reference process ready (the same runtime imported as the candidate's ``backend``)
    and load the reference (``load``: a LoadOpRequest or LoadModuleRequest). None when it is
    loaded, else why not (in words)."""
    from modulelens.validation.candidate_messages import Loaded, ReadyRequest

    try:
        proc.request(ReadyRequest(backend=backend), timeout)
        loaded = proc.request(load, timeout)
    except CandidateDied as e:
        return f"the reference process {e.reason}: {e.stderr_tail[-300:]}"
    if not isinstance(loaded, Loaded) or not loaded.ok:
        return f"the reference could not be loaded: {getattr(loaded, 'error', loaded)}"
    return None


def time_against(checker: CandidateChecker, reference: Callable[[], TimedProcess], candidate: TimedProcess,
                 plan: TimingPlan, what: str, checked_against: str) -> SpeedupMeasurement | None:
    """Time ``candidate`` against the reference side ``reference()`` makes, check extra batches
    until enough were verified, and record the speedup in ``checker.report`` (None and the report
    saying why when the reference could not be timed: the candidate is not to blame)."""
    from modulelens.timing import measure_speedup

    try:
        m = measure_speedup(reference(), candidate, plan, checker.threads)
    except ReferenceFailed as e:
        checker.report.timing_status, checker.report.timing_reason = "undetermined", str(e)
        checker.report.timing_note = f"{what}: not timed: {e}"
        return None
    settle_verification(candidate)
    record_timing(checker.report, m, what)
    if candidate.verify is not None:
        checker.check(f"timed outputs match the {checked_against}", True,
                      f"{candidate.verified} timed batch(es) checked, drawn after they ran")
    return m


def record_timing(report: Any, m: SpeedupMeasurement, what: str) -> None:
    """Put the speedup over eager into a validation report: the number only when determined."""
    report.measurement = m.detail()
    report.eager, report.candidate = m.base, m.candidate
    report.speedup_vs_eager = m.speedup if m.status == "ok" else None
    report.speedup_interval = m.interval
    report.timing_status, report.timing_reason = m.status, m.reason
    report.timing_note = m.note(what)


def record_compile_timing(report: Any, m: SpeedupMeasurement) -> None:
    """Put the speedup over torch.compile into a validation report (same rules)."""
    report.compiled_baseline = m.base
    report.speedup_vs_compile = m.speedup if m.status == "ok" else None
    report.speedup_vs_compile_interval = m.interval
    report.compile_timing_status, report.compile_timing_reason = m.status, m.reason


def timing_plan(min_seconds: float, budget_s: float, target_width: float) -> TimingPlan:
    """The plan of a validation's timing (see :class:`~modulelens.validation.report.CheckSettings`)."""
    return TimingPlan(min_seconds=min_seconds, budget_s=max(budget_s, min_seconds), target_width=target_width)


def alone(side: TimedProcess, plan: TimingPlan, warmup: int) -> Timing:
    """One side timed alone (``profile`` of a candidate): batches of about ``plan.batch_s`` until
    ``plan.min_seconds``; the median, p20 and p80 of per-call times over batches."""
    import statistics

    from modulelens.timing import percentile

    for r in range(warmup):
        side.batch(1, r)
    one = min(side.batch(1, 0) for _ in range(3))
    calls = max(1, min(plan.max_calls, int(plan.batch_s / max(one, 1e-9))))
    per_call: list[float] = []
    spent, r = 0.0, 1
    while spent < plan.min_seconds or len(per_call) < 5:
        t = side.batch(calls, r)
        per_call.append(t / calls)
        spent += t
        r += 1
        if len(per_call) >= 200:
            break
    threads = side.checker.threads.threads if side.checker.threads else torch.get_num_threads()
    return Timing(median_s=statistics.median(per_call), p20_s=percentile(per_call, 0.2),
                  p80_s=percentile(per_call, 0.8), runs=calls * len(per_call), samples=len(per_call), warmup=warmup,
                  timer=f"{side.timer}, {calls} call(s) per batch, fresh values per batch", device=side.device,
                  threads=threads, cache="warm (caches are not flushed between calls)")
