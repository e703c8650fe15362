"""Validate a candidate kernel against an operator card. Runs inside a sandbox worker.

Checks, in order: compiles; runs; output count, shape, dtype, device, layout; values on every
captured sample and on fresh inputs (several seeds and distributions: normal, uniform,
heavy-tailed, special values) with per-dtype tolerances plus a check relative to the output's own
scale; inputs not mutated; outputs not aliasing inputs and not stale memory (reference outputs are
kept alive and the allocator is poisoned with NaN before each call); timers untouched; then timing
against eager (and torch.compile when asked) and the checks again after timing. The candidate is a
*wrapper* when it calls torch operators or vendor libraries for the computation.
"""

from __future__ import annotations

import re
import time
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import modulelens.profiling.timing as timing_module
from modulelens.capture.values import flatten
from modulelens.errors import ModuleLensError
from modulelens.kernels.backends import CompileError, get_backend
from modulelens.kernels.report import Check, ValidationReport
from modulelens.numerics import tolerances
from modulelens.ops.cards import open_card, sample_call
from modulelens.ops.model import OpCard
from modulelens.ops.recorder import classify, resolve_op
from modulelens.profiling.timing import Timing
from modulelens.repo import Repository
from modulelens.sandbox.messages import (
    PongResult,
    RefusedResult,
    SandboxResult,
    SandboxTask,
    TimeCandidateTask,
    TimedResult,
    ValidateCardTask,
    ValidatedResult,
)

# What the timers are before any candidate code runs; a candidate that replaces one is rejected.
_TIMERS: dict[str, Callable[[], Any]] = {
    "time.perf_counter": lambda: time.perf_counter,
    "time.perf_counter_ns": lambda: time.perf_counter_ns,
    "time.monotonic": lambda: time.monotonic,
    "time.time": lambda: time.time,
    "timeit.default_timer": lambda: timeit.default_timer,
    "torch.utils.benchmark.Timer.timeit": lambda: __import__("torch.utils.benchmark", fromlist=["Timer"]).Timer.timeit,
    "torch.cuda.synchronize": lambda: torch.cuda.synchronize,
    "torch.cuda.Event.elapsed_time": lambda: torch.cuda.Event.elapsed_time,
    "modulelens.profiling.timing.time_callable": lambda: timing_module.time_callable,
}
_ORIGINAL_TIMERS = {name: get() for name, get in _TIMERS.items()}
_time_callable = timing_module.time_callable

# Operators a custom kernel may call: allocation, copies, views and metadata.
_ALLOWED = {
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like", "new_zeros",
    "full", "full_like", "new_full", "fill_", "zero_", "copy_", "clone", "contiguous", "_to_copy", "resize_",
    "set_", "lift_fresh_copy", "_local_scalar_dense", "sym_size", "sym_stride", "sym_numel", "is_same_size",
    "equal",
}
_VENDOR = re.compile(r"\b(cublas\w*|cublasLt\w*|cudnn\w*|cutlass::\w+|mkl_\w+|cblas_\w+|dnnl::\w+|at::(?:native::)?(?:mm|bmm|addmm|matmul|linear|conv\w*|softmax|_softmax|layer_norm|native_layer_norm|gelu|group_norm|scaled_dot_product\w*))\b")

_REL_L2 = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}


def changed_timers() -> list[str]:
    out = []
    for name, get in _TIMERS.items():
        try:
            if get() is not _ORIGINAL_TIMERS[name]:
                out.append(name)
        except Exception:  # noqa: BLE001 - a timer that vanished counts as replaced
            out.append(name)
    return out


class _CallCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        base = func.name().split("::")[-1].split(".")[0]
        if base not in _ALLOWED and classify(func) != "view":
            self.calls[str(func)] = self.calls.get(str(func), 0) + 1
        return func(*args, **(kwargs or {}))


def _tensors(x: Any) -> list[torch.Tensor]:
    return [t for t in flatten(x) if isinstance(t, torch.Tensor)]


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.device != b.device or a.numel() == 0 or b.numel() == 0:
        return False
    try:
        sa, sb = a.untyped_storage(), b.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return False
    pa, pb = sa.data_ptr(), sb.data_ptr()
    return pa < pb + sb.nbytes() and pb < pa + sa.nbytes()


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point() or a.is_complex():
        return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())
    return torch.equal(a, b)


def compare_output(got: torch.Tensor, want: torch.Tensor, rtol: float | None, atol: float | None,
                   noise: torch.Tensor | None = None) -> tuple[bool, str]:
    """allclose with per-dtype tolerances where atol shrinks with the output's own scale, plus a
    relative L2 error bound: outputs near zero cannot pass by being zero. ``noise`` (optional) is
    how far eager itself moves when its inputs move by a rounding error: ill-conditioned elements
    (a mean of +-1e4 values that is near 0) get that much more room."""
    if tuple(got.shape) != tuple(want.shape):
        return False, f"shape {list(got.shape)} != expected {list(want.shape)}"
    if got.dtype != want.dtype:
        return False, f"dtype {got.dtype} != expected {want.dtype}"
    if got.device != want.device:
        return False, f"device {got.device} != expected {want.device}"
    if got.layout != want.layout:
        return False, f"layout {got.layout} != expected {want.layout}"
    if not (want.is_floating_point() or want.is_complex()):
        ok = torch.equal(got, want)
        return ok, "" if ok else f"{int((got != want).sum())} of {want.numel()} values differ"
    r, a = tolerances(want.dtype)
    r = rtol if rtol is not None else r
    a = atol if atol is not None else a
    g, w = got.detach().double(), want.detach().double()
    nan_w, nan_g = torch.isnan(w), torch.isnan(g)
    if not torch.equal(nan_w, nan_g):
        extra = int((nan_g & ~nan_w).sum())
        why = f"{extra} NaN where the reference has none" if extra else f"{int((nan_w & ~nan_g).sum())} NaN missing"
        return False, why + (" (memory the kernel did not write?)" if extra else "")
    finite = torch.isfinite(w)
    if not torch.equal(torch.isinf(g) & ~nan_g, torch.isinf(w)) or not torch.equal(g[torch.isinf(w)], w[torch.isinf(w)]):
        return False, "infinities differ from the reference"
    gf, wf = g[finite], w[finite]
    if wf.numel() == 0:
        return True, ""
    scale = float(wf.abs().max())
    # Absolute room: the dtype's atol, shrunk for small outputs (zeros cannot pass for tiny results) and
    # grown to a few units of rounding of the largest output (elements near zero in a large output
    # carry the rounding error of their large neighbours).
    atol_eff = max(a * min(1.0, scale), 8 * torch.finfo(want.dtype).eps * scale)
    err = (gf - wf).abs()
    room = atol_eff + r * wf.abs()
    if noise is not None:
        room = room + 4 * noise.detach().double()[finite]
    bad = err > room
    rel_l2 = float(torch.linalg.vector_norm(gf - wf) / max(float(torch.linalg.vector_norm(wf)), 1e-300))
    bound = _REL_L2.get(want.dtype, 1e-3) if rtol is None else max(rtol, 1e-12) * 10
    if bool(bad.any()) or rel_l2 > bound:
        return False, (f"{int(bad.sum())} of {wf.numel()} values outside tolerance (max abs err {float(err.max()):.3g}, "
                       f"rel L2 err {rel_l2:.3g}, output scale {scale:.3g}, rtol {r:g}, atol {atol_eff:.3g})")
    return True, ""


def _eager_noise(op, args: list, kwargs: dict, inplace: bool) -> list[torch.Tensor] | None:
    """|eager(x) - eager(x')| where x' moves every floating input by about two units of rounding:
    the part of the result that rounding alone decides (large where the operator is ill-conditioned)."""
    g = torch.Generator().manual_seed(1234)

    def nudge(t):
        if not (isinstance(t, torch.Tensor) and t.is_floating_point()):
            return t.clone() if isinstance(t, torch.Tensor) else t
        eps = torch.finfo(t.dtype).eps
        signs = torch.randint(0, 2, t.shape, generator=g).to(t.device, t.dtype) * 2 - 1
        return t * (1 + 2 * eps * signs)

    try:
        clean = _tensors(op(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args], **kwargs))
        a2 = [nudge(a) for a in args]
        moved = _tensors(op(*a2, **{k: nudge(v) for k, v in kwargs.items()}))
    except Exception:  # noqa: BLE001 - then no extra room
        return None
    if inplace:
        return None
    return [(c.double() - m.double()).abs() if c.shape == m.shape and c.is_floating_point() else torch.zeros(())
            for c, m in zip(clean, moved)]


def fresh_inputs(args: list, kwargs: dict, seed: int, dist: str) -> tuple[list, dict]:
    """Random inputs like the sample: same shapes, dtypes, strides; floating tensors redrawn."""
    g = torch.Generator().manual_seed(seed)

    def draw(t: torch.Tensor) -> torch.Tensor:
        if not t.is_floating_point():
            return t.clone()
        shape = tuple(t.shape)
        if dist == "normal":
            x = torch.randn(shape, generator=g, dtype=torch.float64)
        elif dist == "uniform":
            x = torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1
        elif dist == "heavy":
            x = torch.empty(shape, dtype=torch.float64).cauchy_(generator=g).clamp_(-1e4, 1e4)
        else:  # special values sprinkled over a normal background
            x = torch.randn(shape, generator=g, dtype=torch.float64)
            specials = torch.tensor([0.0, -0.0, 1e4, -1e4, 1e-30, -1e-30, 1.0, -1.0], dtype=torch.float64)
            mask = torch.rand(shape, generator=g) < 0.05
            picks = specials[torch.randint(0, len(specials), shape, generator=g)]
            x = torch.where(mask, picks, x)
        out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
        out.copy_(x.to(t.dtype))
        return out

    new_args = [draw(a) if isinstance(a, torch.Tensor) else a for a in args]
    new_kwargs = {k: draw(v) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    return new_args, new_kwargs


class _Validator:
    def __init__(self, task: ValidateCardTask, stage: Callable[[str], None]):
        self.task = task
        self.stage_cb = stage
        self.report = ValidationReport(verdict="rejected", correct=False, reason="", stage="compile",
                                       backend=task.candidate.backend)
        self.rtol, self.atol = task.rtol, task.atol
        self.calls: dict[str, int] = {}

    def stage(self, name: str) -> None:
        self.report.stage = name
        self.stage_cb(name)

    def check(self, name: str, passed: bool, detail: str = "") -> bool:
        self.report.checks.append(Check(name=name, passed=passed, detail=detail))
        return passed

    def reject(self, reason: str) -> ValidationReport:
        self.report.verdict = "rejected"
        self.report.reason = reason
        return self.report

    # ----------------------------------------------------------------------------------------
    def run(self) -> ValidationReport:
        cand = self.task.candidate
        backend = get_backend(cand.backend)
        status = backend.status()
        build_dir = Path(self.task.build_dir)
        art, card = open_card(Repository(self.task.repo), self.task.card_id)
        device = self.task.device or card.device
        if device.startswith("cuda") and not torch.cuda.is_available():
            device = "cpu"
        vendor = sorted(set(m.group(1) for m in _VENDOR.finditer(cand.source)))

        self.stage("compile")
        if not status.can_run:
            try:
                log = backend.compile_only(cand.source, build_dir)
            except CompileError as e:
                self.report.errors = [e.message]
                return self.reject(f"does not compile: {e.message}")
            self.report.compiled = True
            self.check("compiles", True, log[-300:])
            self.report.reason = f"compiled; not run: {status.why}"
            self.report.timing_note = status.why
            self.report.stage = "done"
            return self.report
        try:
            entry = backend.load(cand.source, cand.entry, build_dir)
        except CompileError as e:
            self.report.errors = [e.message]
            self.check("compiles", False, e.message)
            return self.reject(f"does not compile: {e.message}")
        self.report.compiled = True
        self.check("compiles", True)
        tampered = changed_timers()
        if tampered:
            return self.reject(f"replaces timer functions when loaded: {', '.join(tampered)}")

        op = resolve_op(card.op)
        inplace = op._schema.name.endswith("_") or any(a.alias_info is not None and a.alias_info.is_write
                                                        for a in op._schema.arguments)
        samples = [sample_call(art, card, i, device=device) for i in range(len(card.samples))]
        cases: list[tuple[str, list, dict]] = [(f"captured sample {i}", a, k) for i, (a, k, _, _) in enumerate(samples)]
        base_args, base_kwargs = samples[0][0], samples[0][1]
        for seed in self.task.seeds:
            for dist in self.task.distributions:
                a, k = fresh_inputs(base_args, base_kwargs, seed, dist)
                cases.append((f"{dist} inputs, seed {seed}", a, k))

        self.stage("check")
        for label, args, kwargs in cases:
            problem = self.check_case(op, entry, args, kwargs, inplace, label)
            if problem:
                return self.reject(problem)
        self.report.ran = True
        self.report.correct = True
        self.report.backend_calls = sorted(self.calls) + vendor

        if self.task.time:
            if not status.can_time:
                self.report.timing_note = status.why
            else:
                self.stage("time")
                self.time_it(op, entry, base_args, base_kwargs, card, device)
                tampered = changed_timers()
                if tampered:
                    self.report.correct = False
                    return self.reject(f"replaced timer functions while running: {', '.join(tampered)}")
                self.stage("recheck")
                problem = self.check_case(op, entry, base_args, base_kwargs, inplace, "captured sample after timing")
                if problem:
                    self.report.correct = False
                    return self.reject(problem)
        self.report.stage = "done"
        if self.report.backend_calls:
            self.report.verdict = "wrapper"
            self.report.reason = ("correct, but it calls back into " + ", ".join(self.report.backend_calls[:5])
                                  + " for the computation")
        else:
            self.report.verdict = "custom"
            self.report.reason = "correct on every captured and fresh input; computes the result itself"
        return self.report

    def check_case(self, op, entry, args: list, kwargs: dict, inplace: bool, label: str) -> str | None:
        ref_args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        ref_kwargs = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        expected = op(*ref_args, **ref_kwargs)  # kept alive: its memory cannot be handed to the candidate
        want = _tensors(expected)
        cand_args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        cand_kwargs = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        snapshot = [a.clone() if isinstance(a, torch.Tensor) else None for a in cand_args]
        for w in want:  # poison freed blocks of the output sizes with NaN
            poison = torch.full_like(w, float("nan")) if w.is_floating_point() else torch.full_like(w, -7)
            del poison
        counter = _CallCounter()
        try:
            with counter:
                out = entry(*cand_args, *cand_kwargs.values())
        except MemoryError as e:
            return f"exceeded the memory limit on {label}: {e}"
        except RuntimeError as e:
            text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            if "allocate" in text or "memory" in text.lower():
                return f"exceeded the memory limit on {label}: {text[:300]}"
            self.report.errors.append(f"{type(e).__name__}: {text[:500]}")
            return f"raised {type(e).__name__} on {label}: {text[:300]}"
        except Exception as e:  # noqa: BLE001 - any exception from user code is a verdict
            text = str(e).strip().splitlines()[0] if str(e).strip() else ""
            self.report.errors.append(f"{type(e).__name__}: {text[:500]}")
            return f"raised {type(e).__name__} on {label}: {text[:300]}"
        for k, v in counter.calls.items():
            self.calls[k] = self.calls.get(k, 0) + v
        got = _tensors(out)
        if not self.check(f"output structure ({label})", len(got) == len(want),
                          f"{len(got)} tensors returned, {len(want)} expected"):
            return f"returns {len(got)} tensor(s) where the operator returns {len(want)} ({label})"
        for i, (g, _) in enumerate(zip(got, want)):
            for j, a in enumerate(cand_args):
                if isinstance(a, torch.Tensor) and _overlaps(g, a) and not (inplace and j == 0):
                    self.check(f"no aliasing ({label})", False, f"output {i} shares memory with input {j}")
                    return f"output {i} is (a view of) input {j}: kernels must write their own output ({label})"
        for i, (a, snap) in enumerate(zip(cand_args, snapshot)):
            if snap is not None and not (inplace and i == 0) and not _same_bits(a, snap):
                self.check(f"inputs unchanged ({label})", False, f"input {i} modified")
                return f"mutates input {i} ({label}); kernels must not modify their inputs"
        if inplace:  # the operator's contract is to update its first argument
            got = [cand_args[0]] + got[1:] if got else got
            want = [ref_args[0]] + want[1:] if want else want
        noise = None
        for i, (g, w) in enumerate(zip(got, want)):
            ok, detail = compare_output(g, w, self.rtol, self.atol)
            if not ok and g.shape == w.shape and g.dtype == w.dtype and w.is_floating_point():
                # Eager is not exact either: allow what eager itself moves under rounding-sized input changes.
                noise = noise if noise is not None else _eager_noise(op, args, kwargs, inplace)
                if noise is not None and i < len(noise) and noise[i].shape == w.shape:
                    ok, detail2 = compare_output(g, w, self.rtol, self.atol, noise=noise[i])
                    detail = detail if ok else f"{detail2} (with eager's own rounding sensitivity allowed)"
            if not self.check(f"output {i} values ({label})", ok, detail):
                return f"output {i} is wrong on {label}: {detail}"
        return None

    def time_it(self, op, entry, args: list, kwargs: dict, card: OpCard, device: str) -> None:
        min_run = self.task.min_run_time
        eager_fn = lambda: op(*args, **kwargs)  # noqa: E731
        cand_fn = lambda: entry(*args, *kwargs.values())  # noqa: E731
        rounds = []
        for _ in range(2):  # interleaved, so drift hits both alike
            rounds.append((_time_callable(eager_fn, device, min_run_time=min_run / 2),
                           _time_callable(cand_fn, device, min_run_time=min_run / 2)))
        eager = min((r[0] for r in rounds), key=lambda t: t.median_s)
        cand = min((r[1] for r in rounds), key=lambda t: t.median_s)
        self.report.eager, self.report.candidate = eager, cand
        self.report.speedup_vs_eager = eager.median_s / cand.median_s
        if self.task.compile_baseline:
            compiled = torch.compile(lambda *a: op(*a, **kwargs), dynamic=False)
            compiled(*args)
            ct = _time_callable(lambda: compiled(*args), device, min_run_time=min_run / 2)
            self.report.compiled_baseline = ct
            self.report.speedup_vs_compile = ct.median_s / cand.median_s
        self.report.timing_note = (f"medians of the faster of two interleaved rounds each; {eager.timer}; "
                                   f"{eager.threads} threads; {eager.cache}")
        if self.report.speedup_vs_eager > 10:
            self.report.flags.append(f"suspicious: {self.report.speedup_vs_eager:.1f}x faster than eager")
        if card.kind == "memory" and card.bytes_per_call:
            from modulelens.profiling.bandwidth import copy_bandwidth

            floor = card.bytes_per_call / copy_bandwidth(device)["bytes_per_s"]
            if cand.median_s < 0.5 * floor and card.bytes_per_call > 8 << 20:
                self.report.flags.append(
                    f"suspicious: {cand.median_s * 1e6:.1f} us is under half the {floor * 1e6:.1f} us this machine "
                    f"needs to move {card.bytes_per_call} bytes")


def time_candidate(task: TimeCandidateTask) -> Timing:
    """Time a candidate alone on its card's first captured sample (for ``profile``)."""
    cand = task.candidate
    backend = get_backend(cand.backend)
    status = backend.status()
    if not (status.can_run and status.can_time):
        raise ModuleLensError(f"{cand.backend} candidates cannot be timed here: {status.why}",
                              "profile it on a machine with the right device")
    entry = backend.load(cand.source, cand.entry, Path(task.build_dir))
    art, card = open_card(Repository(task.repo), task.card_id)
    device = task.device or card.device
    args, kwargs, _, _ = sample_call(art, card, 0, device=device)
    t = _time_callable(lambda: entry(*args, *kwargs.values()), device, min_run_time=task.min_run_time,
                       warmup=task.warmup)
    tampered = changed_timers()
    if tampered:
        raise ModuleLensError(f"the candidate replaced timer functions: {', '.join(tampered)}", "it cannot be timed")
    return t


def validate_card(task: ValidateCardTask, stage: Callable[[str], None]) -> ValidationReport:
    """Validate the task's candidate against its card; every outcome, a failure to set up included,
    is a report."""
    t0 = time.perf_counter()
    try:
        report = _Validator(task, stage).run()
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
        report = validate_card(task, stage)
        return ValidatedResult(report=report, healthy=not changed_timers() and report.verdict != "rejected")
    return PongResult()
