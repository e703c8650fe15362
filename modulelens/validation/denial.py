"""Wrapper detection by denial: a candidate that passed every check, with no other sign of calling
back into a library, is run once more in a fresh contained candidate process where the reference
library is unusable before any of its code loads (:mod:`modulelens.validation.poison`). Correct
there, it computes by itself (``custom``); raising, dying or wrong there, it computed through what
was denied (``wrapper``, the denied operator named when the error names it); not even buildable
there, nothing is confirmed (``wrapper``, saying so).

Denial poisons the dispatcher's registrations, not ATen's code: a candidate calling
``at::cpu::gelu``, a DispatchStub kernel or the MKL ``sgemm_`` linked into ``libtorch_cpu.so`` by
address would stay correct there. So once it is correct there, the checker watches where its CPU
time goes (:mod:`modulelens.validation.sampling`): the kernel samples the program counter of every
thread of the process through sampling events the process handed over before any candidate code
(the candidate holds no descriptor of them), while the candidate repeats its first case for about
:data:`SAMPLED_CPU_S` of CPU. At least :data:`~modulelens.validation.sampling.COMPUTE_SHARE` of
the samples in torch's compute code (ATen's kernels, vectorised math, MKL/oneDNN, system BLAS)
makes it a wrapper, the route named (``95% of its time in libtorch_cpu.so ...vectorized_gelu``);
a sampler that saw far less CPU time than the kernel accounts to the process (switched off,
threads it does not cover, samples lost) makes computing by itself unconfirmed, named. Where the
kernel offers no sampler (``perf_event_open`` refused), the denial says so and decides as before.
Where a module candidate declared library operators (``keep``), their kernels compute legitimately
there, and where its time goes is not judged (said so).

What decides is observed by the checker, not reported by the candidate: the bytes of its outputs
in the arena, whether its process died, ``/proc/PID/maps`` (written by the kernel) showing
numpy's code still inaccessible after the calls, and the kernel's samples of where its time went.
The libraries it loads there are scanned like those of its first run (a candidate that loads
another library once denied is seen).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import torch

from modulelens.validation.candidate_messages import Denied, DenyRequest, Loaded, Ready, ReadyRequest
from modulelens.validation.checker import CandidateChecker, CandidateFailed, ModuleCall, start_candidate
from modulelens.validation.poison import executable_ranges, numerical_library_paths
from modulelens.validation.report import Denial, ValidationReport
from modulelens.validation.sampling import (
    COMPUTE_SHARE,
    MIN_COMPUTE_SAMPLES,
    PERIOD_NS,
    Samples,
    TaskSampler,
    attribute,
    coverage_problem,
)

DENIAL_EVIDENCE = ("a run in a fresh contained process where every computing operator of torch's dispatcher raises "
                   "and numpy's code is unusable before any candidate code loads (decided by the checker from "
                   "the outputs' bytes, the process's death and its memory map), and where the kernel samples "
                   "which code its CPU time goes to (torch's compute code called by address is seen there)")
SAMPLED_CPU_S = 0.05  # CPU time the candidate is watched for (about 2,000 samples)
PROBE_CALLS = 1  # the first sampled batch, which sizes the next (a call may take a second: Triton's interpreter)
MAX_SAMPLED_CALLS = 4096
MAX_SAMPLED_WALL_S = 10.0
_DENIED_OP = re.compile(r"modulelens denial: (\S+) is denied here")

Case = tuple[str, list, dict, list[torch.Tensor], ModuleCall | None]
"""(label, args, kwargs, expected outputs, module call or None for a card call)."""


class _DenialRun(CandidateChecker):
    """The checker's handle on the denial process: its own scratch report (nothing it records
    reaches the validation's report but the :class:`Denial`)."""

    def __init__(self, call_timeout: float):
        self.report = ValidationReport(verdict="rejected", correct=False, reason="", stage="denial", backend="denial")
        self.stage_cb = lambda _: None
        self.call_timeout = call_timeout
        self.numpy_bridges: set[str] = set()
        self.own_pid = 0  # the harness's pid in its own namespace (from its ready answer, before candidate code)

    def get_ready(self, backend: str) -> None:
        reply = self._request(ReadyRequest(backend=backend))
        if not isinstance(reply, Ready):
            raise CandidateFailed(f"the candidate process answered a ready request with {reply.kind}")
        self.baseline_maps = self.proc.mapped_files()
        self.own_pid = reply.pid


def numpy_mode(backend: str) -> Literal["memory", "python"]:
    """How numpy is denied: in memory, unless the candidate is a Triton kernel (the CPU interpreter
    computes with numpy). A module candidate running Triton kernels through the CPU interpreter
    therefore fails its denial run (not confirmed custom on a machine without a GPU)."""
    return "python" if backend == "triton" else "memory"


class PreparedDenial:
    """A denial process made ready before it is needed (:func:`prepare_denial`): contained, the
    reference library already denied in it, nothing of the candidate's loaded yet. Its owner
    passes it to :func:`check_by_denial` or discards it."""

    def __init__(self, run: _DenialRun, denied: str, problem: str | None):
        self.run, self.denied, self.problem = run, denied, problem

    def discard(self) -> None:
        self.run.proc.remove()


def prepare_denial(*, backend: str, memory_limit_mb: int, read_only: list[Path], call_timeout: float,
                   numpy: Literal["memory", "python"], keep: tuple[str, ...] = ()) -> PreparedDenial:
    """Start a denial process and deny the reference library in it (see the module docstring),
    before any candidate code exists there. A checker may do this while it waits for something else
    (the settling of a check's outputs), so the setup costs no time of its own. A setup that failed
    once the process started is carried as the prepared denial's ``problem`` (an inconclusive
    denial), not raised. ``keep``: base names of the aten operators left usable there (the library
    operators a module candidate declares: :mod:`modulelens.kernels.library_ops`)."""
    run = _DenialRun(call_timeout)
    run.proc = start_candidate(memory_limit_mb, read_only=read_only)
    try:
        run.get_ready(backend)
        reply = run._request(DenyRequest(numpy=numpy, keep=list(keep)))
    except CandidateFailed as e:
        return PreparedDenial(run, "nothing (the denial could not be set up)",
                              f"the denial process failed before the calls: {e}")
    if not isinstance(reply, Denied) or reply.error:
        return PreparedDenial(run, "nothing (the denial could not be set up)",
                              f"the denial could not be set up: {getattr(reply, 'error', reply.kind)}")
    denied = _described(reply, numpy, keep)
    if run.proc.sampler_fds() and not keep:
        denied += ("; where its CPU time goes is sampled by the kernel (a perf task-clock event per CPU on the process "
                   "and every thread it starts, handed to the checker before any candidate code)")
    if numpy == "memory" and executable_ranges(run.proc.maps(), numerical_library_paths()):
        return PreparedDenial(run, denied, "numpy's code could not be made unusable in the denial process")
    return PreparedDenial(run, denied, None)


def check_by_denial(*, backend: str, memory_limit_mb: int, read_only: list[Path], call_timeout: float,
                    numpy: Literal["memory", "python"], load: Callable[[CandidateChecker], Loaded],
                    cases: list[Case], compare: Callable[[list[torch.Tensor], list[torch.Tensor], str], str | None],
                    prepared: PreparedDenial | None = None, keep: tuple[str, ...] = ()) -> tuple[Denial, list[str]]:
    """Run the candidate in a denial process (see the module docstring): ``load`` builds it there,
    each case is called and its outputs checked with ``compare`` (a problem, or None). Returns the
    :class:`Denial` and the vendor/ATen symbols of the libraries it built and loaded there (a
    module candidate compiles its extensions again there: its first run's build folder is not
    trusted, and the build tool would not reuse it from another folder anyway). ``prepared``: the
    process made ready earlier by :func:`prepare_denial` with the same arguments (else it is made
    now, leaving the aten operators named in ``keep`` usable); it is removed in the end either way."""
    if prepared is None:
        prepared = prepare_denial(backend=backend, memory_limit_mb=memory_limit_mb, read_only=read_only,
                                  call_timeout=call_timeout, numpy=numpy, keep=keep)
    run, denied = prepared.run, prepared.denied
    found: list[str] = []

    def result(outcome: str, detail: str) -> tuple[Denial, list[str]]:
        return Denial(outcome=outcome, detail=detail, denied=denied), found

    try:
        if prepared.problem:
            return result("inconclusive", prepared.problem)
        roots = numerical_library_paths()
        try:
            loaded = load(run)
        except CandidateFailed as e:
            return result("inconclusive", f"it could not be built there: {e}")
        if not loaded.ok:
            return result("inconclusive", f"it could not be built there: {loaded.error}")
        for label, args, kwargs, want, module_call in cases:
            try:
                got = run.call(args, kwargs, want, trace=False, label=label, module_call=module_call)
            except CandidateFailed as e:
                found = run.built_symbols()
                return result("fails", _failure(str(e), run))
            problem = compare(got.outputs, want, label)
            if problem:
                found = run.built_symbols()
                return result("fails", f"wrong there: {problem}")
        found = run.built_symbols()
        if numpy == "memory":
            again = executable_ranges(run.proc.maps(), roots)
            if again:
                return result("fails", f"it made numpy's code executable again ({os.path.basename(again[0][2])})")
        correct = f"correct on {len(cases)} call(s) where the reference library is denied"
        if keep:
            return result("computes itself", f"{correct}; where its time goes is not judged (it declared library "
                          f"operators, whose kernels compute there: {', '.join('aten::' + k for k in keep)})")
        outcome, watched = watch_time(run, cases[0])
        return result(outcome, f"{correct}; {watched}" if outcome == "computes itself" else watched)
    except CandidateFailed as e:
        return result("inconclusive", f"the denial process failed before the calls: {e}")
    finally:
        prepared.discard()


def watch_time(run: _DenialRun, case: Case) -> tuple[str, str]:
    """(outcome, detail) of watching where the candidate's CPU time goes in the denial process
    (see the module docstring) while it repeats ``case``: ``fails`` with the route when torch's
    compute code takes its share, ``inconclusive`` when the sampler was tampered with or lost its
    samples, else ``computes itself`` (with what was seen, or why nothing could be)."""
    fds = run.proc.sampler_fds()
    if not fds:
        return "computes itself", "where its time goes was not watched (the kernel offers no sampling event here)"
    try:
        sampler = TaskSampler(fds, run.proc.candidate_pid())
    except OSError as e:
        return "computes itself", f"where its time goes was not watched (the sampler's ring could not be mapped: {e})"
    try:
        total, calls = _sampled_calls(run, sampler, case)
    except CandidateFailed as e:
        return "fails", f"it failed while its time was watched: {e}"
    finally:
        sampler.close()
    problem = coverage_problem(total)
    if problem:
        return "inconclusive", f"where its time goes could not be seen: {problem}"
    ips = [ip for ip, pid in zip(total.ips, total.pids) if pid == run.own_pid or not run.own_pid]
    others = len(total.ips) - len(ips)
    if others > len(ips):
        return "inconclusive", (f"{others} of {len(total.ips)} samples of its CPU time were in other processes "
                                "it started (their code is not attributed)")
    seen = attribute(ips, run.proc.maps())
    share = seen.compute_share()
    if seen.compute >= MIN_COMPUTE_SAMPLES and share >= COMPUTE_SHARE:
        return "fails", (f"its CPU time goes to the reference's own code, called past the denied dispatcher: "
                         f"{seen.route()} (over {calls} calls)")
    return "computes itself", (f"{100 * share:.1f}% of its sampled CPU time in torch's compute code "
                               f"({seen.compute} of {seen.total} samples over {calls} calls)")


def _sampled_calls(run: _DenialRun, sampler: TaskSampler, case: Case) -> tuple[Samples, int]:
    """Call ``case`` in batches, the sampler enabled around each: :data:`PROBE_CALLS` calls, then
    each batch as many as the CPU per call seen so far says make up about :data:`SAMPLED_CPU_S` of
    CPU in all (bounded by what one ring holds), until most of it is seen, :data:`MAX_SAMPLED_CALLS`
    calls are made or :data:`MAX_SAMPLED_WALL_S` has passed: every batch's samples together, and
    the calls made."""
    import time

    label, args, kwargs, want, module_call = case
    target_ns = min(SAMPLED_CPU_S * 1e9, 0.5 * sampler.capacity() * PERIOD_NS)
    total, calls, n, seed = Samples(), 0, PROBE_CALLS, 1
    t0 = time.monotonic()
    while True:
        request, _ = run.encode_call(args, kwargs, want, False, module_call, calls=n, seed=seed)
        sampler.start()
        try:
            reply = run._request(request)
        finally:
            got = sampler.stop()
        run.read_reply(reply, label)
        total.ips += got.ips
        total.pids += got.pids
        total.lost += got.lost
        total.sampled_ns += got.sampled_ns
        total.cpu_ns += got.cpu_ns
        calls += n
        seed += 1
        total.overflowed |= got.overflowed
        if (total.sampled_ns >= 0.8 * target_ns or calls >= MAX_SAMPLED_CALLS
                or time.monotonic() - t0 > MAX_SAMPLED_WALL_S):
            return total, calls
        per_call = max(got.sampled_ns / n, 1.0)
        n = max(1, int(min((target_ns - total.sampled_ns) / per_call, MAX_SAMPLED_CALLS - calls)))


def _failure(error: str, run: _DenialRun) -> str:
    """What a failed call in the denial process amounts to, naming the denied operator when the
    error or the process's last words name one."""
    m = _DENIED_OP.search(error) or _DENIED_OP.search(run.report.stderr_tail or "")
    if m:
        return f"it calls {m.group(1)}, which is denied there ({error[:200]})"
    return error[:300]


def _described(reply: Denied, numpy: str, keep: tuple[str, ...] = ()) -> str:
    how = ("numpy and the other numerical libraries: " + reply.numpy
           + ("; kernel-enforced: " + ", ".join(reply.layers) if reply.layers else ""))
    if numpy == "memory":
        how += "; checked by the checker in /proc/PID/maps before and after the calls"
    kept = (f" but the declared library operators {', '.join('aten::' + k for k in keep)}" if keep else "")
    return (f"{reply.operators} kernels of computing operators raise (every operator namespace; the CPU backends, and "
            f"the CUDA ones on a GPU){kept}; {how}")


def verdict(denial: Denial) -> tuple[Literal["custom", "wrapper"], str]:
    """(verdict, reason) of a correct candidate with no other wrapper evidence, from its denial run."""
    if denial.outcome == "computes itself":
        return "custom", "correct, and still correct where the reference library is denied: computes the result itself"
    if denial.outcome == "fails":
        return "wrapper", f"correct, but not where the reference library is denied: {denial.detail}"
    return "wrapper", f"correct, but computing by itself is not confirmed: {denial.detail}"

