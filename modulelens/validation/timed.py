"""Timing inside validation: the reference and the candidate as two contained processes set up
the same way, timed by the checker's clock through the same request, and timed calls that are
checked calls.

* :class:`TimedProcess` is a :class:`~modulelens.timing.Side` over one contained process
  (:func:`~modulelens.validation.checker.start_candidate`, the :mod:`.harness`): a batch is one
  :class:`CallRequest` of ``calls`` calls timed by :func:`~modulelens.validation.checker.time_calls`.
  The reference side (the card's aten operator, the original module, torch.compile) is such a
  process too, with the same containment, thread count, arena and pipes: whatever they cost falls
  on both sides, and the candidate never shares a process (or a CPU while held) with it.
* :class:`TimingFeed` gives every batch fresh input values and a fresh seed for the swaps between
  its calls (:mod:`.perturb`): the n-th batch of every side in a round gets the same ones (so both
  sides of a round are timed on the same inputs), the two batches of one side in a round
  different ones (so a cache filled in the first cannot serve the second, which the round would
  keep as the faster). Values and seeds come from a secret drawn per feed: nothing in the
  candidate's source can know them in advance.
* Every call counts: the harness keeps what every call of a batch returned, and after *every*
  timed batch of the candidate the checker draws :data:`VERIFIED_CALLS` of its calls (the draw
  happens here, after the batch answered, and is never sent before it) and has their outputs
  copied out; each is checked against the reference on the inputs that call saw (the swaps
  replayed up to it), and the inputs in the arena are checked unchanged but for the swaps. A
  candidate that computes one call in k and returns an earlier result for the others (however it
  learns where a batch ends, e.g. from the harness's stack) is caught on a drawn call that it
  skipped: "its timed outputs disagree with the reference: ... on call j of a timed batch". At
  least :data:`MIN_VERIFIED` batches of several calls per measurement are checked (extra untimed
  ones, built the same way, when the timed batches held one call each or the timing ended early).
* What output checks cannot see: a candidate that rewrites the harness in its own process so that
  copying a call's outputs out *computes* them (lazily, after the batch's clock stopped). That
  needs code running in the fetch, which an honest candidate never has; it is beyond what this
  side of the pipe can verify, and shows as a speedup beyond belief (flagged, see
  :mod:`.plausibility`).
* Memory: keeping every call's outputs costs ``calls`` times the output bytes in the candidate's
  process (and the reference's, which runs the same harness); :func:`retained_calls` caps the
  calls per batch so that this stays under :data:`RETAINED_BYTES`.

On CUDA, a batch ends with a device synchronisation in the harness and is timed by the checker's
clock like on CPU (CUDA events cannot be read across processes, and events recorded by the
candidate's process would be its claim); in-process comparisons (``check_pack``, the GPU
benchmark) use CUDA events and an L2 flush (:class:`~modulelens.timing.CallableSide`).
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable
from typing import Any

import torch

from modulelens.sandbox import CandidateDied, CandidateProcess
from modulelens.timing import SpeedupMeasurement, Timing, TimingPlan, TreeClock
from modulelens.validation.candidate_messages import FetchRequest
from modulelens.validation.checker import CandidateChecker, CandidateFailed, ModuleCall, time_calls
from modulelens.validation.compare import same_bits
from modulelens.validation.inputs import fresh_inputs
from modulelens.validation.perturb import perturbed, replay

VERIFIED_CALLS = 2  # calls of every timed batch of the candidate checked after the fact (all when fewer)
MIN_VERIFIED = 2  # timed-style batches checked per measurement at least (extra ones if the timing ended early)
RETAINED_BYTES = 256 << 20  # most output bytes a batch keeps (every call's outputs are kept until checked)
_RANDOM = secrets.SystemRandom()

Verify = Callable[[list[torch.Tensor], list, dict, str], "str | None"]
"""(outputs, final args, final kwargs, label) -> None when right, else why not."""


def _derived(secret: int, round_index: int, n: int, what: str) -> int:
    """A 62-bit number from the feed's secret, the round, the batch's place in it and ``what``."""
    digest = hashlib.blake2b(f"{secret}:{round_index}:{n}:{what}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 2


class TimingFeed:
    """The inputs of timed batches (see the module docstring): the ``n``-th batch of round ``r``
    gets fresh values (normal) shaped like ``args``/``kwargs`` and a swap seed, both derived from
    a secret drawn when the feed is made; every side's ``n``-th batch of round ``r`` gets the
    same, no two batches of one side the same."""

    KEPT = 4  # batches' values kept (the sides of a round ask for the same ones in turn)

    def __init__(self, args: list, kwargs: dict):
        self.args, self.kwargs = args, kwargs
        self._secret = _RANDOM.randrange(1 << 62)
        self._kept: dict[tuple[int, int], tuple[list, dict, int]] = {}

    def batch(self, r: int, n: int) -> tuple[list, dict, int]:
        """(args, kwargs, swap seed) of the ``n``-th batch (0-based) of round ``r``."""
        got = self._kept.get((r, n))
        if got is None:
            values = fresh_inputs(self.args, self.kwargs, _derived(self._secret, r, n, "values"), "normal")
            got = (values[0], values[1], _derived(self._secret, r, n, "swaps"))
            self._kept[(r, n)] = got
            while len(self._kept) > self.KEPT:
                self._kept.pop(next(iter(self._kept)))
        return got


def retained_calls(want: list[torch.Tensor], most: int) -> int:
    """Calls per batch at most (``most`` or fewer) so that keeping every call's outputs stays
    under :data:`RETAINED_BYTES`."""
    per_call = sum(max(w.numel() * w.element_size(), 1) for w in want) or 1
    return max(1, min(most, RETAINED_BYTES // per_call))


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
    """The inputs the ``calls``-th call of a batch saw (its last, when ``calls`` is the batch's
    length): copies of ``args``/``kwargs`` with the batch's swaps before that call replayed (see
    :mod:`.perturb`); also the copies' tensors in encoding order."""
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
        self._batches_in: dict[int, int] = {}  # round -> batches this side ran in it
        self._cpu_clock: TreeClock | None = None
        self.verified = 0
        self.verified_batches_of_several = 0
        self.last_calls = 1

    def _call_fields(self, calls: int, round_index: int, n: int) -> tuple[Any, list, dict, int, list]:
        args, kwargs, seed = self.feed.batch(round_index, n)
        request, written = self.checker.encode_call(args, kwargs, self.want, False, self.module_call,
                                                    proc=self.proc, calls=calls, seed=seed)
        return request, args, kwargs, seed, [slot for slot, _ in written]

    def _next(self, round_index: int) -> int:
        """This side's place among its batches of ``round_index`` (the feed pairs sides by it)."""
        return self._batches_in.get(round_index, 0)

    def prepare(self, calls: int, round_index: int) -> None:
        self._pending = (calls, round_index, self._call_fields(calls, round_index, self._next(round_index)))

    def batch(self, calls: int, round_index: int) -> float:
        pending, self._pending = self._pending, None
        if pending is not None and pending[:2] == (calls, round_index):
            fields = pending[2]
        else:
            fields = self._call_fields(calls, round_index, self._next(round_index))
        self._batches_in[round_index] = self._next(round_index) + 1
        request, args, kwargs, seed, slots = fields
        self.last_calls = calls
        label = f"a timed batch of {calls} call(s)"
        clock = self.cpu_clock
        try:
            clock.start()
            seconds, reply = time_calls(self.proc, request, self.checker.call_timeout)
            clock.stop(seconds)
            outputs, _, _ = self.checker.read_reply(reply, label, self.proc)
        except CandidateDied as e:
            if self.reference:
                raise ReferenceFailed(f"the {self.label} reference process {e.reason} while being timed") from None
            raise CandidateFailed(f"the {self.label} process {e.reason} while being timed") from None
        except CandidateFailed as e:
            if self.reference:
                raise ReferenceFailed(f"the {self.label} reference {e}") from None
            raise
        if self.verify is not None:
            self._check(outputs, request, args, kwargs, seed, calls, slots, "timed batch")
        return seconds

    def _check(self, last: list[torch.Tensor], request: Any, args: list, kwargs: dict, seed: int, calls: int,
               slots: list, what: str) -> None:
        """A batch checked after it ran: the inputs in the arena against those its last call saw
        (the swaps undone or anything else written fails), then the outputs of
        :data:`VERIFIED_CALLS` calls drawn now, each copied out of the candidate's process and
        compared with the reference on the inputs that call saw."""
        assert self.verify is not None
        who = "" if self.label == "candidate" else f"{self.label}: "
        _, _, flat = final_inputs(args, kwargs, seed, calls)
        for i, (slot, want) in enumerate(zip(slots, flat)):
            if not same_bits(self.proc.arena.read(slot), want):
                raise CandidateFailed(f"{who}its timed batches change their inputs: input {i} after a {what} of "
                                      f"{calls} call(s) is not what the checker wrote (with the swaps between calls)")
        self.verified += 1
        self.verified_batches_of_several += calls > 1
        for j in sorted(_RANDOM.sample(range(calls), min(VERIFIED_CALLS, calls))):
            label = f"call {j + 1} of a {what} of {calls} call(s)"
            outputs = last if j == calls - 1 else self._fetch(request.output_offset, j, label)
            a, k, _ = final_inputs(args, kwargs, seed, j + 1)
            problem = self.verify(outputs, a, k, label)
            if problem:
                raise CandidateFailed(f"{who}its timed outputs disagree with the reference: {problem}")

    @property
    def cpu_clock(self) -> TreeClock:
        """The CPU-time clock of this side's process tree (:mod:`modulelens.timing.cputime`)."""
        if self._cpu_clock is None:
            self._cpu_clock = TreeClock.of(self.pids()[0])
        return self._cpu_clock

    def _fetch(self, offset: int, call: int, label: str) -> list[torch.Tensor]:
        """The outputs call ``call`` of the last batch returned, copied out by the candidate's process
        (work the checker asked for: not counted as work outside the batches)."""
        try:
            with self.cpu_clock.excused():
                reply = self.proc.request(FetchRequest(output_offset=offset, call=call), self.checker.call_timeout)
        except CandidateDied as e:
            raise CandidateFailed(f"the {self.label} process {e.reason} while its timed outputs were read") from None
        outputs, _, _ = self.checker.read_reply(reply, f"the outputs of {label}", self.proc)
        return outputs

    def check_extra(self, round_index: int, calls: int) -> None:
        """A batch built like a timed one (fresh values, swaps), not timed, checked like one."""
        if self.verify is None:
            return
        request, args, kwargs, seed, slots = self._call_fields(calls, round_index, 0)
        try:
            with self.cpu_clock.excused():
                _, reply = time_calls(self.proc, request, self.checker.call_timeout)
        except CandidateDied as e:
            raise CandidateFailed(f"the {self.label} process {e.reason} during a checked batch") from None
        outputs, _, _ = self.checker.read_reply(reply, f"a batch of {calls} call(s) like the timed ones", self.proc)
        self._check(outputs, request, args, kwargs, seed, calls, slots, "batch like the timed ones")

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


EXTRA_CALLS = 8  # calls of an extra checked batch at least (a batch of one call has no call to skip)


def settle_verification(side: TimedProcess) -> None:
    """Check extra batches (as long as the last timed one, and at least :data:`EXTRA_CALLS`
    calls) until :data:`MIN_VERIFIED` of the candidate's batches of several calls were checked:
    on a machine so busy that the timed batches held one call each, a candidate skipping calls
    is still caught."""
    r = 1 << 20
    while side.verify is not None and side.verified_batches_of_several < MIN_VERIFIED:
        side.check_extra(r, max(side.last_calls, EXTRA_CALLS))
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

    plan = plan.model_copy(update={"max_calls": retained_calls(candidate.want, plan.max_calls)})
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

    plan = plan.model_copy(update={"max_calls": retained_calls(side.want, plan.max_calls)})
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
