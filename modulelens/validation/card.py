"""Validate a candidate kernel against an operator card. Runs inside a sandbox worker.

Checks, in order: compiles; runs; output count, shape, dtype, device, layout; values on every
captured sample, on the operator's own edge cases (:mod:`.edge_cases`: masked rows, constant rows,
exp overflow, NaN and infinities, -0 and denormals, OpInfo samples; a ``@triton.jit`` kernel under
the interpreter gets at most :data:`~.edge_cases.INTERPRETER_LIMIT` of them, and the report's
``edge_cases_note`` names the others) and on fresh inputs (several
seeds and distributions: normal, uniform, heavy-tailed, special values; every floating tensor argument is redrawn, weights and biases
included, and the report's ``varied`` names them) with per-dtype tolerances plus a check relative
to the output's own scale, eager's own rounding sensitivity, and a float64 oracle (an output as
close to the float64 result as eager's, within :data:`~modulelens.validation.compare.ORACLE_MULTIPLE`
times, passes); inputs not mutated; outputs not sharing the inputs' memory (decided by the checker
from the arena) and not stale memory (reference outputs are kept alive and the allocator is
poisoned with NaN before each call); timers untouched; then timing against eager (and
torch.compile when asked), each in a reference process of its own, in interleaved rounds whose
batches are checked calls (:mod:`.timed`), and the checks again after timing. The candidate is a
*wrapper* when it calls torch operators or vendor libraries for the computation; with no sign of
that, it is run once more where the reference library is denied
(:mod:`modulelens.validation.denial`) and is *custom* only when it stays correct there.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

from modulelens.device import DeviceUnavailable, require
from modulelens.errors import ModuleLensError
from modulelens.kernels import LIB_SUFFIX, declared_rule, get_backend, published_build, triton_interpreting
from modulelens.ops import OpCard, open_card, resolve_op, sample_call
from modulelens.repo import Repository
from modulelens.timing import Timing, measure_speedup, thread_choice
from modulelens.validation.candidate_messages import Loaded, LoadOpRequest, LoadRequest
from modulelens.validation.checker import CandidateChecker, CandidateFailed, start_candidate
from modulelens.validation.compare import compare_output, eager_noise, float64_args, judged_by_oracle, same_bits
from modulelens.validation.denial import (
    DENIAL_EVIDENCE,
    PreparedDenial,
    check_by_denial,
    numpy_mode,
    prepare_denial,
)
from modulelens.validation.denial import verdict as denial_verdict
from modulelens.validation.edge_cases import capped_for_interpreter, described, edge_cases
from modulelens.validation.evidence import FOREIGN_EVIDENCE, LIBRARY_EVIDENCE, NOT_SEEN, computing_ops, library_symbols
from modulelens.validation.inputs import floating_names, fresh_inputs, tensors
from modulelens.validation.messages import (
    PongResult,
    RefusedResult,
    SandboxResult,
    SandboxTask,
    TimeCandidateTask,
    TimedResult,
    ValidateCardTask,
    ValidatedResult,
    memory_refusal,
    out_of_memory,
)
from modulelens.validation.plausibility import speedup_flags
from modulelens.validation.report import ValidationReport
from modulelens.validation.shape_rules import checked_rule, rule_problem, shape_rule_cases
from modulelens.validation.timed import (
    ReferenceFailed,
    TimedProcess,
    TimingFeed,
    alone,
    load_reference,
    record_compile_timing,
    time_against,
    timing_plan,
)

DELAY_S = 0.2  # outputs are read again this long after a call returned (late writers)


class _Validator(CandidateChecker):
    """The checker: holds the card, the reference outputs and the verdict; the candidate runs in a
    :class:`CandidateProcess` that sees only the inputs written into the shared arena."""

    def __init__(self, task: ValidateCardTask, stage: Callable[[str], None]):
        self.task = task
        self.stage_cb = stage
        self.report = ValidationReport(verdict="rejected", correct=False, reason="", stage="compile",
                                       backend=task.candidate.backend)
        self.rtol, self.atol = task.rtol, task.atol
        self.call_timeout = task.call_timeout
        self.ops: set[str] = set()
        self.numpy_bridges: set[str] = set()
        self.traced = True

    def run(self) -> ValidationReport:
        shared = Path(self.task.build_dir)
        self.threads = thread_choice()
        self.proc = start_candidate(self.task.memory_limit_mb, read_only=[shared])
        self.references: list = []  # the eager (and torch.compile) reference processes, once started
        self.prepared_denial: PreparedDenial | None = None  # made ready during the last check (see _deny)
        try:
            return self._run(shared)
        except CandidateFailed as e:
            return self.reject(str(e))
        finally:
            self.report.stdout_bytes = self.proc.stdout_bytes()
            self.proc.remove()
            for ref in self.references:
                ref.remove()
            if self.prepared_denial is not None:
                self.prepared_denial.discard()

    def _start_references(self) -> None:
        """Start the reference processes now, so that their start overlaps the checks: set up
        exactly like the candidate's (same launcher, harness, limits and readable folders)."""
        count = (1 + self.task.compile_baseline) if self.task.time else 0
        self.references = [start_candidate(self.task.memory_limit_mb, read_only=list(self.proc.read_only))
                           for _ in range(count)]

    # ----------------------------------------------------------------------------------------
    def _run(self, shared: Path) -> ValidationReport:
        cand = self.task.candidate
        status = get_backend(cand.backend).status()
        art, card = open_card(Repository(self.task.repo), self.task.card_id)
        device = require(self.task.device or card.device)

        self.stage("compile")
        self.get_ready(cand.backend)
        loaded = self._request(LoadRequest(candidate=cand, build_dir=str(self.proc.scratch / "build"),
                                           shared_build_dir=str(shared), compile_only=not status.can_run),
                               timeout=self.task.build_timeout)
        self.report.isolation = self._isolation(loaded, Path(self.task.repo))
        if not loaded.ok:
            self.report.errors = [loaded.error]
            self.check("compiles", False, loaded.error)
            return self.reject(f"does not compile: {loaded.error}")
        self.report.compiled = True
        self.check("compiles", True, loaded.log_tail)
        library = self._publish(loaded, shared)
        if not status.can_run:
            self.report.reason = f"compiled; not run: {status.why}"
            self.report.timing_note = status.why
            self.report.stage = "done"
            return self.report
        symbols = library_symbols(library) if library else []

        op = resolve_op(card.op)
        inplace = op._schema.name.endswith("_") or any(a.alias_info is not None and a.alias_info.is_write
                                                        for a in op._schema.arguments)
        samples = [sample_call(art, card, i, device=device) for i in range(len(card.samples))]
        cases: list[tuple[str, list, dict]] = [(f"captured sample {i}", a, k) for i, (a, k, _, _) in enumerate(samples)]
        base_args, base_kwargs = samples[0][0], samples[0][1]
        self.report.varied = floating_names(base_args, base_kwargs, [a.name for a in op._schema.arguments])
        self.report.varied_how = ("redrawn in every fresh-input case (seeds x distributions: normal, uniform, "
                                  "heavy-tailed, special values), weights and biases like the other arguments")
        # the operator's own edge cases before the random draws: a failure names the case
        edges = edge_cases(card.op, base_args, base_kwargs, seed=self.task.seeds[0] if self.task.seeds else 0)
        if cand.backend == "triton" and "triton.jit" in cand.source and triton_interpreting():
            # an interpreted Triton kernel takes seconds a call: a few edge cases, and the report says so
            edges, self.report.edge_cases_note = capped_for_interpreter(edges)
        cases += [(e.label, e.args, e.kwargs) for e in edges]
        self.report.edge_cases = [described(e) for e in edges]
        edge_labels = {e.label for e in edges}
        for seed in self.task.seeds:
            for dist in self.task.distributions:
                a, k = fresh_inputs(base_args, base_kwargs, seed, dist)
                cases.append((f"{dist} inputs, seed {seed}", a, k))
        rule = declared_rule(cand.source)  # the variable dimensions it claims: checked at sizes not captured
        if rule is not None:
            problem = rule_problem(rule, base_args, base_kwargs)
            if problem:
                return self.reject(f"its declared shape rule ({rule.text()}) does not fit the card: {problem}")
            cases += shape_rule_cases(rule, base_args, base_kwargs)

        if status.can_time:
            self._start_references()
        self.stage("check")
        for n, (label, args, kwargs) in enumerate(cases):
            last = n == len(cases) - 1
            problem = self.check_case(op, args, kwargs, inplace, label, settle=n == 0 or last,
                                      meanwhile=self._prepare_denial if last and not self.task.time else None)
            # (timed: the denial is made ready during the recheck after timing, just before it is needed)
            if problem:
                self.report.failed_edge_case = label if label in edge_labels else None
                return self.reject(problem)
        self.report.ran = True
        self.report.correct = True
        if rule is not None:
            self.report.shape_rule = checked_rule(rule, base_args, base_kwargs)

        if self.task.time:
            if not status.can_time:
                self.report.timing_note = status.why
            else:
                self.stage("time")
                self.time_it(op, base_args, base_kwargs, card, device, inplace)
                self.stage("recheck")
                # new values into the very buffers the timed calls used: a result kept per pointer is stale now
                a, k = fresh_inputs(base_args, base_kwargs, 9973, "normal")
                problem = self.check_case(op, a, k, inplace, "fresh values in the timed buffers after timing",
                                          settle=True, meanwhile=self._prepare_denial)
                if problem:
                    return self.reject(problem)
        self.report.stage = "done"
        symbols = symbols or self.built_symbols()
        foreign = self.foreign_evidence()
        self.report.backend_calls = sorted(self.ops) + symbols
        self.report.wrapper_evidence = self._evidence(library is not None)
        if foreign:
            self.report.verdict = "wrapper"
            self.report.reason = "correct, but it computes with a foreign library: " + "; ".join(foreign)
            self.report.backend_calls += foreign
        elif self.report.backend_calls:
            self.report.verdict = "wrapper"
            self.report.reason = ("correct, but it calls back into " + ", ".join(self.report.backend_calls[:5])
                                  + " for the computation")
        else:
            self._deny(op, inplace, cases[0], shared)
        return self.report

    def _denial_settings(self) -> dict:
        cand = self.task.candidate
        return {"backend": cand.backend, "memory_limit_mb": self.task.memory_limit_mb,
                "read_only": [Path(self.task.build_dir)], "call_timeout": self.call_timeout,
                "numpy": numpy_mode(cand.backend)}

    def _prepare_denial(self) -> None:
        """Make the denial process ready while the last check's outputs settle, when nothing seen so
        far says the candidate is a wrapper (the run decides from the denial only then); discarded
        unused if later evidence decides instead."""
        if not self.ops and not self.numpy_bridges and self.prepared_denial is None:
            self.prepared_denial = prepare_denial(**self._denial_settings())

    def _deny(self, op, inplace: bool, first: tuple[str, list, dict], shared: Path) -> None:
        """Run the candidate where the reference library is denied (:mod:`.denial`) and decide custom
        or wrapper from that; on the first captured sample and one fresh draw."""
        self.stage("denial")
        cand = self.task.candidate
        label, args, kwargs = first
        fresh = fresh_inputs(args, kwargs, self.task.seeds[0] if self.task.seeds else 0, "normal")
        calls, inputs = [], {}
        for what, a, k in ((label, args, kwargs), ("normal inputs", *fresh)):
            want = tensors(op(*[x.clone() if isinstance(x, torch.Tensor) else x for x in a], **k))
            calls.append((f"denial, {what}", a, k, want, None))
            inputs[f"denial, {what}"] = (a, k)

        def load(checker: CandidateChecker) -> Loaded:
            return checker._request(LoadRequest(candidate=cand, build_dir=str(checker.proc.scratch / "build"),
                                                shared_build_dir=str(shared)), timeout=self.task.build_timeout)

        def compare(got: list, want: list, what: str) -> str | None:
            a, k = inputs[what]
            return self._compare(op, a, k, inplace, [g.to(w.device) for g, w in zip(got, want)], want, what)

        prepared, self.prepared_denial = self.prepared_denial, None
        denial, more = check_by_denial(**self._denial_settings(), load=load, cases=calls, compare=compare,
                                       prepared=prepared)
        self.report.denial = denial
        self.check("correct where the reference library is denied", denial.outcome == "computes itself",
                   denial.detail)
        self.report.stage = "done"
        if more:
            self.report.backend_calls += more
            self.report.verdict = "wrapper"
            self.report.reason = ("correct, but a library it loaded where the reference library is denied calls into "
                                  + ", ".join(more[:5]))
            return
        self.report.verdict, self.report.reason = denial_verdict(denial)

    def _publish(self, loaded: Loaded, shared: Path) -> Path | None:
        """The candidate's extension library, found by the address this checker computes from the
        candidate's source (never the name or path the candidate reports): the shared cache's
        entry when it verifies and the candidate used it, else the candidate's fresh build in its
        scratch folder, published only when it is the inode the candidate's process mapped, read
        while the candidate is stopped (:meth:`share_fresh_build`). An entry that fails its
        checksum is named in the checks and replaced. None for backends that build nothing.
        Raises CandidateFailed when a build it must have cannot be verified."""
        cand = self.task.candidate
        address = get_backend(cand.backend).build_name(cand.source, cand.entry)
        if address is None:
            return None
        filename = f"{address}{LIB_SUFFIX}"
        found = published_build(address, filename, shared)
        if found is not None and not loaded.fresh_build:
            return found
        if found is None:
            self.note_stale_build(shared, address, filename, "build")
        self.proc.pause()
        try:
            published = self.share_fresh_build(shared, address, filename, self.proc.maps())
        except ValueError as e:
            self.check("build verified", False, str(e))
            raise CandidateFailed(f"its build cannot be verified: {e}") from None
        finally:
            self.proc.resume()
        self.check("build verified", True, f"the inode its process mapped, shared as {address}" if published
                   else "the inode its process mapped; not shared: the build cache could not be written")
        return published

    def _evidence(self, scanned: bool) -> str:
        parts = ["aten ops recorded by the profiler in the candidate's process, all threads (reported by that "
                 "process, so a candidate that disables profiling there could hide them)"]
        if scanned:
            parts.append("the extension's imported library symbols, read by the checker (vendor libraries and "
                         "ATen kernels called past the dispatcher)")
        parts += [LIBRARY_EVIDENCE, FOREIGN_EVIDENCE, DENIAL_EVIDENCE, NOT_SEEN]
        return "; ".join(parts)

    def check_case(self, op, args: list, kwargs: dict, inplace: bool, label: str, settle: bool = False,
                   meanwhile: Callable[[], None] | None = None) -> str | None:
        """None when the candidate is right on this case, else why not. With ``settle``, the outputs
        are read again at least :data:`DELAY_S` after the call returned (anything still writing them
        fails); ``meanwhile`` is work done during that wait instead of sleeping through it."""
        ref_args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        ref_kwargs = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        want = tensors(op(*ref_args, **ref_kwargs))
        result = self.call(args, kwargs, want, trace=True, label=label)
        returned = time.monotonic()
        self.report.ran = True  # its outputs are compared below, whatever they turn out to be
        if result.ops is None:
            self.traced = False
        else:
            self.ops.update(computing_ops(result.ops))
        got = [g.to(w.device) if g.device != w.device else g for g, w in zip(result.outputs, want)]
        got += result.outputs[len(want):]
        if not self.check(f"output structure ({label})", len(got) == len(want),
                          f"{len(got)} tensors returned, {len(want)} expected"):
            return f"returns {len(got)} tensor(s) where the operator returns {len(want)} ({label})"
        arena = self.proc.arena
        tensor_inputs = [a for a in [*args, *kwargs.values()] if isinstance(a, torch.Tensor)]
        for i, (slot, before) in enumerate(result.inputs):
            if not (inplace and i == 0) and not same_bits(arena.read(slot), before):
                self.check(f"inputs unchanged ({label})", False, f"input {i} modified")
                return f"mutates input {i} ({label}); kernels must not modify their inputs"
        if inplace and result.inputs and tensor_inputs:  # the operator's contract is to update its first argument
            got = [arena.read(result.inputs[0][0]).to(want[0].device)] + got[1:]
            want = [ref_args[0]] + want[1:]
        shared = self.outputs_sharing_inputs(result, frozenset({0}) if inplace else frozenset())
        if shared:
            self.check(f"no aliasing ({label})", False, f"output {shared[0]} changed when the checker rewrote the inputs")
            return (f"output {shared[0]} shares memory with the inputs (it changed when the checker rewrote them after "
                    f"the call): kernels must write their own output ({label})")
        problem = self._compare(op, args, kwargs, inplace, got, want, label)
        if problem:
            return problem
        if not settle:
            return None
        if meanwhile is not None:
            meanwhile()
        time.sleep(max(0.0, returned + DELAY_S - time.monotonic()))
        for i, (slot, g) in enumerate(zip(result.output_slots, result.outputs)):
            if not same_bits(arena.read(slot), g):
                self.check(f"output {i} stable ({label})", False, "changed after the call returned")
                return f"output {i} changed {DELAY_S:g} s after the call returned ({label}): something writes it late"
        return None

    def _compare(self, op, args, kwargs, inplace, got, want, label, quiet: bool = False) -> str | None:
        """Why ``got`` is not ``want`` on ``label`` (None when every output passes): the tolerances,
        then eager's own rounding sensitivity, then the float64 oracle. ``quiet``: only a failure goes
        into the report (the checks of timed batches)."""
        noise = oracle = None
        for i, (g, w) in enumerate(zip(got, want)):
            ok, detail = compare_output(g, w, self.rtol, self.atol)
            entry = None
            if not ok and g.shape == w.shape and g.dtype == w.dtype and w.is_floating_point() and args:
                # Eager is not exact either: allow what eager itself moves under rounding-sized input changes.
                noise = noise if noise is not None else eager_noise(op, args, kwargs, inplace)
                if noise is not None and i < len(noise) and noise[i].shape == w.shape:
                    ok, detail2 = compare_output(g, w, self.rtol, self.atol, noise=noise[i])
                    detail = detail if ok else f"{detail2} (with eager's own rounding sensitivity allowed)"
                if not ok and not inplace:  # and as close to the float64 result as eager is
                    oracle = oracle if oracle is not None else _oracle(op, args, kwargs)
                    if i < len(oracle) and oracle[i].shape == w.shape:
                        ok, entry, detail = judged_by_oracle(g, w, oracle[i], label, i, detail)
            if entry is not None and not (quiet and ok):
                self.report.accuracy.append(entry)
            if quiet and ok:
                continue
            if not self.check(f"output {i} values ({label})", ok, detail):
                return f"output {i} is wrong on {label}: {detail}"
        return None

    def time_it(self, op, args: list, kwargs: dict, card: OpCard, device: str, inplace: bool) -> None:
        """Eager (the card's operator, in a reference process set up like the candidate's) against
        the candidate, by this process's clock through the same request, in interleaved rounds
        (:mod:`.timed`); the candidate's timed outputs are checked on a random sample of batches."""
        want = tensors(op(*args, **kwargs))
        self.call(args, kwargs, want, trace=False, label="timing inputs")
        plan = timing_plan(self.task.min_run_time, self.task.timing_budget_s, self.task.target_width)
        feed = TimingFeed(args, kwargs)
        cand = TimedProcess(self, self.proc, "candidate", device, feed, want,
                            verify=None if inplace else self._verify_timed(op))
        load = LoadOpRequest(op=card.op, positional=len(args), kw_names=list(kwargs))
        what = f"{card.op} on card {card.card_id}'s first sample shape (fresh values per round)"
        eager = partial(self._reference_side, self.references[0], load, "eager", device, feed, want, args, kwargs)
        time_against(self, eager, cand, plan, what, "reference")
        if self.task.compile_baseline:
            load = load.model_copy(update={"compiled": True})
            try:
                compiled = self._reference_side(self.references[1], load, "torch.compile", device, feed, want, args,
                                                kwargs)
                record_compile_timing(self.report, measure_speedup(compiled, cand, plan, self.threads))
            except ReferenceFailed as e:
                self.report.compile_timing_status, self.report.compile_timing_reason = "undetermined", str(e)
        if self.report.eager and self.report.candidate:
            self.report.flags.extend(speedup_flags(self.report.eager, self.report.candidate,
                                                   self.report.compiled_baseline))
        cand_t = self.report.candidate
        if cand_t and card.kind == "memory" and card.bytes_per_call:
            from modulelens.profiling.bandwidth import copy_bandwidth

            floor = card.bytes_per_call / copy_bandwidth(device)["bytes_per_s"]
            if cand_t.median_s < 0.5 * floor and card.bytes_per_call > 8 << 20:
                self.report.flags.append(
                    f"suspicious: {cand_t.median_s * 1e6:.1f} us is under half the {floor * 1e6:.1f} us this machine "
                    f"needs to move {card.bytes_per_call} bytes")

    def _reference_side(self, proc, load: LoadOpRequest, label: str, device: str, feed: TimingFeed,
                        want: list, args: list, kwargs: dict) -> TimedProcess:
        """The reference process ready to be timed (loaded, one call made). Raises ReferenceFailed."""
        problem = load_reference(self, proc, self.task.candidate.backend, load, self.task.build_timeout)
        if problem is None:
            try:
                request, _ = self.encode_call(args, kwargs, want, False, proc=proc)
                self.read_reply(proc.request(request, self.call_timeout), f"the {label} reference", proc)
            except Exception as e:  # noqa: BLE001 - a reference that cannot run leaves the speedup undetermined
                problem = f"the {label} reference process failed: {e}"
        if problem:
            raise ReferenceFailed(problem)
        return TimedProcess(self, proc, label, device, feed, want, reference=True)

    def _verify_timed(self, op):
        """The check of a timed batch's outputs: against ``op`` on the inputs its last call saw,
        judged like the checks (eager's own rounding sensitivity and the float64 oracle allowed)."""
        def verify(outputs: list, args: list, kwargs: dict, label: str) -> str | None:
            want = tensors(op(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args],
                              **{k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}))
            if len(outputs) < len(want):
                return f"{len(outputs)} tensor(s) returned on {label}, {len(want)} expected"
            got = [g.to(w.device) for g, w in zip(outputs, want)]
            return self._compare(op, args, kwargs, False, got, want, label, quiet=True)

        return verify


def _oracle(op, args: list, kwargs: dict) -> list[torch.Tensor]:
    """The operator's outputs on float64 copies of its floating inputs ([] when it cannot run so or
    gives no float64 output)."""
    try:
        out = tensors(op(*float64_args(list(args)), **dict(zip(kwargs, float64_args(list(kwargs.values()))))))
    except Exception:  # noqa: BLE001 - an operator that cannot run in float64 has no oracle
        return []
    return [] if any(o.is_floating_point() and o.dtype != torch.float64 for o in out) else out


def time_candidate(task: TimeCandidateTask) -> Timing:
    """Time a candidate alone on its card's first captured sample (for ``profile``), by the
    checker's clock around batches of calls made in the candidate's own process (fresh values
    each batch, as in validation)."""
    from modulelens.timing import TimingPlan

    cand = task.candidate
    status = get_backend(cand.backend).status()
    if not (status.can_run and status.can_time):
        raise ModuleLensError(f"{cand.backend} candidates cannot be timed here: {status.why}",
                              "profile it on a machine with the right device")
    art, card = open_card(Repository(task.repo), task.card_id)
    device = require(task.device or card.device)
    args, kwargs, _, _ = sample_call(art, card, 0, device=device)
    settings = ValidateCardTask(repo=task.repo, candidate=cand, build_dir=task.build_dir, card_id=task.card_id,
                                device=device, time=False)
    checker = _Validator(settings, lambda _: None)
    checker.threads = thread_choice()
    checker.proc = start_candidate(settings.memory_limit_mb, read_only=[Path(task.build_dir)])
    try:
        loaded = checker._request(LoadRequest(candidate=cand, build_dir=str(checker.proc.scratch / "build"),
                                              shared_build_dir=task.build_dir), timeout=settings.build_timeout)
        if not loaded.ok:
            raise ModuleLensError(f"the candidate does not compile: {loaded.error}", "fix it and validate it first")
        checker._publish(loaded, Path(task.build_dir))
        want = tensors(resolve_op(card.op)(*args, **kwargs))
        checker.call(args, kwargs, want, trace=False, label="the first sample")
        side = TimedProcess(checker, checker.proc, "candidate", device, TimingFeed(args, kwargs), want)
        return alone(side, TimingPlan(min_seconds=task.min_run_time), task.warmup)
    except CandidateFailed as e:
        raise ModuleLensError(f"the candidate failed while being timed: {e}", "validate it first") from None
    finally:
        checker.proc.remove()


def validate_card(task: ValidateCardTask, stage: Callable[[str], None]) -> ValidationReport:
    """Validate the task's candidate against its card; every outcome, a failure to set up included,
    is a report."""
    t0 = time.perf_counter()
    try:
        report = _Validator(task, stage).run()
    except DeviceUnavailable:
        raise  # a refusal (nothing was validated), not a verdict on the candidate
    except ModuleLensError as e:
        report = ValidationReport(verdict="rejected", correct=False, reason=str(e), stage="setup",
                                  backend=task.candidate.backend)
    report.seconds = time.perf_counter() - t0
    return report


def run_task(task: SandboxTask, stage: Callable[[str], None]) -> SandboxResult:
    """Run one sandbox task in this (worker) process."""
    if isinstance(task, TimeCandidateTask):
        try:
            return TimedResult(timing=time_candidate(task))
        except ModuleLensError as e:
            return RefusedResult(message=e.message, hint=e.hint, healthy=False)
    if isinstance(task, ValidateCardTask):
        try:
            return ValidatedResult(report=validate_card(task, stage))
        except DeviceUnavailable as e:
            return RefusedResult(message=e.message, hint=e.hint, healthy=True)
        except (MemoryError, RuntimeError, OSError) as e:
            if not out_of_memory(e):
                raise
            return memory_refusal(task, f"a candidate against card {task.card_id}", None)
    return PongResult()
