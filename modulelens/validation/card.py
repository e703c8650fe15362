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
import shutil
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from modulelens.capture.values import flatten
from modulelens.errors import ModuleLensError
from modulelens.kernels import build_cache
from modulelens.kernels.backends import get_backend
from modulelens.numerics import tolerances
from modulelens.ops.cards import open_card, sample_call
from modulelens.ops.model import OpCard
from modulelens.ops.recorder import classify, resolve_op
from modulelens.repo import Repository
from modulelens.sandbox.candidate_process import CandidateDied, CandidateProcess
from modulelens.sandbox.containment import Isolation, foreign_in, secrets_layer
from modulelens.sandbox.shm import TensorSlot, aligned, encode_value, span_bytes
from modulelens.timing import Timing, time_callable
from modulelens.validation.candidate_messages import Called, CallRequest, Loaded, LoadRequest, Ready, ReadyRequest
from modulelens.validation.messages import (
    PongResult,
    RefusedResult,
    SandboxResult,
    SandboxTask,
    TimeCandidateTask,
    TimedResult,
    ValidateCardTask,
    ValidatedResult,
)
from modulelens.validation.plausibility import speedup_flags
from modulelens.validation.report import ValidationReport
from modulelens.validation.verdict_keeping import ReportKeeper

# Operators a custom kernel may call: allocation, copies, views and metadata.
_ALLOWED = {
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like", "new_zeros",
    "full", "full_like", "new_full", "fill_", "zero_", "copy_", "clone", "contiguous", "_to_copy", "to", "resize_",
    "set_", "lift_fresh_copy", "_local_scalar_dense", "sym_size", "sym_stride", "sym_numel", "is_same_size",
    "equal", "detach", "alias", "item", "size", "stride", "numel", "dim", "is_contiguous", "data_ptr",
}
# Library symbols a compiled candidate must not import: vendor libraries and ATen's kernels called
# past the dispatcher (at::cpu::gelu, at::native::...), which no dispatcher trace can see.
_LIBRARY_SYMBOL = re.compile(r"^(cublas\w*|cublasLt\w*|cudnn\w*|mkl_\w+|cblas_\w+|dnnl\w*|"
                             r"at::(?:cpu|cuda|native|compositeexplicitautograd|compositeimplicitautograd)::\w+)")
DELAY_S = 0.2  # outputs are read again this long after a call returned (late writers)

FOREIGN_EVIDENCE = ("foreign numerical libraries (scipy, numba, jax, tensorflow, cupy, numpy's lazily loaded "
                    "parts) newly mapped by the candidate's process after the harness's own imports, read by the "
                    "checker from /proc/PID/maps (the kernel writes it; the candidate cannot forge it); crossings "
                    "between torch and numpy during the calls (Tensor.numpy, __array__, from_numpy, "
                    "as_tensor/tensor of an ndarray), counted in the candidate's process (a claim)")
NOT_SEEN = ("not seen: numpy's core (torch maps it at import, so its use shows only through the crossings), "
            "and symbols resolved at run time (dlsym)")

_REL_L2 = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}


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


class _Call:
    """One call of the candidate as the checker saw it: outputs read back from the arena, the input
    slots as written, and the ops the candidate process claims it ran."""

    def __init__(self, outputs: list[torch.Tensor], inputs: list[tuple[TensorSlot, torch.Tensor]],
                 output_slots: list[TensorSlot], aliases: list[int | None], ops: list[str] | None,
                 input_grads: list[torch.Tensor | None] | None = None,
                 param_grads: dict[str, torch.Tensor] | None = None):
        self.outputs, self.inputs, self.output_slots, self.aliases, self.ops = outputs, inputs, output_slots, aliases, ops
        self.input_grads, self.param_grads = input_grads or [], param_grads or {}


class ModuleCall:
    """The module-specific part of a call to a module candidate: mode, RNG state set before it,
    and output gradients to run backward with (``grad_room``: arena bytes to keep for the gradients)."""

    def __init__(self, training: bool, rng: dict[str, torch.Tensor] | None = None,
                 grad_outputs: list[torch.Tensor] | None = None, grad_room: int = 0):
        self.training, self.rng, self.grad_outputs, self.grad_room = training, rng, grad_outputs, grad_room
        self.rng_keys = sorted(rng) if rng else []

    def tensors(self) -> list[torch.Tensor]:
        """The extra tensors written into the arena after the inputs: RNG states, output gradients."""
        return [self.rng[k] for k in self.rng_keys] + list(self.grad_outputs or [])

    def request_fields(self, args: list, kwargs: list, extra: list, names: list[str]) -> dict[str, Any]:
        """CallRequest fields from the encoded values (``extra``: encoded :meth:`tensors`)."""
        n = len(self.rng_keys)
        return {"args": args, "kwargs": dict(zip(names, kwargs)), "training": self.training,
                "rng": dict(zip(self.rng_keys, extra[:n])) if self.rng is not None else None,
                "grad_outputs": extra[n:] if self.grad_outputs is not None else None}


class _CandidateFailed(Exception):
    """The candidate raised, ran out of memory, or died: ``reason`` is the rejection."""


class CandidateChecker(ReportKeeper):
    """The checker's side of one candidate process, shared by card and module validation: it
    sends requests (a death becomes :class:`_CandidateFailed`), writes inputs into the arena and
    reads outputs back, times the candidate by its own clock, reports the isolation in force, and
    reads from ``/proc`` which foreign numerical libraries the candidate's process mapped.
    ``proc`` is the :class:`CandidateProcess`; subclasses hold the reference and the verdict."""

    proc: CandidateProcess
    call_timeout: float

    def _request(self, req, timeout: float | None = None):
        try:
            return self.proc.request(req, timeout or self.call_timeout)
        except CandidateDied as e:
            self.report.stderr_tail = _clean_tail(e.stderr_tail)
            oom = "memory" in e.stderr_tail.lower() or "bad_alloc" in e.stderr_tail
            raise _CandidateFailed(f"the candidate process {e.reason} during {self.report.stage}"
                                   + (" (out of memory)" if oom else "")) from None

    def get_ready(self, backend: str) -> None:
        """Let the harness import its own runtime, then note what the process has mapped: the
        baseline that foreign libraries are judged against (:meth:`foreign_libraries`)."""
        reply = self._request(ReadyRequest(backend=backend))
        if not isinstance(reply, Ready):
            raise _CandidateFailed(f"the candidate process answered a ready request with {reply.kind}")
        self.baseline_maps = self.proc.mapped_files()

    def foreign_libraries(self) -> list[str]:
        """Foreign numerical libraries (:data:`FOREIGN_LIBRARIES`) the candidate's process mapped
        since :meth:`get_ready`, as ``name (file)``: read by this process from ``/proc/PID/maps``,
        which the kernel writes and the candidate cannot forge."""
        base = getattr(self, "baseline_maps", None)
        if base is None:
            return []
        return foreign_in(self.proc.mapped_files() - base)

    def _isolation(self, loaded: Loaded, repo_root: Path) -> Isolation:
        iso = loaded.isolation.model_copy(deep=True)
        if self.proc.namespaces_missing:
            iso.layers = [x for x in iso.layers if x.name != "namespaces"]
            iso.add("namespaces", False, self.proc.namespaces_missing)
        iso.add("process separation", True, "the candidate runs in its own process; reference outputs, "
                "comparison, timing and verdict stay in the checker")
        iso.layers.append(secrets_layer(iso, self.proc.read_only, repo_root))
        return iso

    def _write_inputs(self, values: list) -> tuple[list, list[tuple[TensorSlot, torch.Tensor]], int]:
        arena = self.proc.arena
        written: list[tuple[TensorSlot, torch.Tensor]] = []
        need = sum(aligned(span_bytes(t)) for t in _tensors(values) if isinstance(t, torch.Tensor))
        arena.resize(need + 1)
        offset = 0

        def put(t: torch.Tensor) -> TensorSlot:
            nonlocal offset
            slot = arena.put(t, offset)
            written.append((slot, arena.read(slot)))
            offset = aligned(offset + slot.nbytes)
            return slot

        encoded = [encode_value(v, put) for v in values]
        return encoded, written, offset

    def call(self, args: list, kwargs: dict, want: list[torch.Tensor], trace: bool, label: str,
             module_call: ModuleCall | None = None) -> _Call:
        """Write the inputs, call the candidate once, read its outputs back (and, for a module call
        with output gradients, its gradients). Card calls pass keyword values positionally; module
        calls by name. Raises _CandidateFailed."""
        values = [*args, *kwargs.values()]
        extra = module_call.tensors() if module_call else []
        try:
            encoded, written, end = self._write_inputs(values + extra)
        except ValueError as e:
            raise ModuleLensError(f"inputs cannot be passed to a candidate: {e}", "pick another card") from None
        grad_bytes = sum(aligned(span_bytes(t)) for t in extra)
        out_bytes = sum(aligned(max(w.numel() * w.element_size(), 1)) for w in want)
        self.proc.arena.resize(end + 2 * out_bytes + (module_call.grad_room if module_call else 0) + grad_bytes
                               + (1 << 16))
        fields: dict[str, Any] = {"args": encoded[:len(values)]}
        if module_call:
            fields = module_call.request_fields(encoded[:len(args)], encoded[len(args):len(values)],
                                                encoded[len(values):], list(kwargs))
        reply = self._request(CallRequest(arena_size=self.proc.arena.size, output_offset=end,
                                          poison_nbytes=[w.numel() * w.element_size() for w in want], trace=trace,
                                          **fields))
        if not isinstance(reply, Called):
            raise _CandidateFailed(f"the candidate process answered a call with {reply.kind}")
        if reply.out_of_memory:
            raise _CandidateFailed(f"exceeded the memory limit on {label}: {reply.error[:300]}")
        if reply.error:
            self.report.errors.append(reply.error)
            raise _CandidateFailed(f"raised {reply.error.split(':')[0]} on {label}: {reply.error[:300]}")
        try:
            outputs = [self.proc.arena.read(s) for s in reply.outputs]
            input_grads = [self.proc.arena.read(s) if s is not None else None for s in reply.input_grads]
            param_grads = {n: self.proc.arena.read(s) for n, s in reply.param_grads.items()}
        except ValueError as e:
            raise _CandidateFailed(f"returned an output the checker cannot read ({e}) on {label}") from None
        self.numpy_bridges.update(reply.numpy_bridges)
        return _Call(outputs, written[:len(_tensors(values))], reply.outputs, reply.aliases, reply.ops,
                     input_grads, param_grads)

    def time_rounds(self, eager_call: Callable[[], Any], device: str, min_run_time: float) -> tuple[Timing, Timing]:
        """(eager, candidate): eager timed here while the candidate process is stopped, the
        candidate by this process's clock around batches of its last call; two interleaved
        rounds, the faster of each kept (drift hits both alike)."""
        rounds = []
        for _ in range(2):
            self.proc.pause()
            try:
                eager = time_callable(eager_call, device, min_run_time=min_run_time / 2)
            finally:
                self.proc.resume()
            rounds.append((eager, self._time_candidate(device, min_run_time / 2)))
        eager = min((r[0] for r in rounds), key=lambda t: t.median_s)
        cand = min((r[1] for r in rounds), key=lambda t: t.median_s)
        return eager, cand

    def _time_candidate(self, device: str, min_run_time: float) -> Timing:
        try:
            return checker_timing(self.proc, device, min_run_time, self.call_timeout)
        except RuntimeError as e:
            raise _CandidateFailed(f"raised while being timed: {e}") from None
        except CandidateDied as e:
            raise _CandidateFailed(f"the candidate process {e.reason} while being timed") from None

    def foreign_evidence(self) -> list[str]:
        """Wrapper evidence the checker holds beyond aten ops: foreign libraries newly mapped,
        torch<->numpy crossings (claimed)."""
        found = [f"maps {name}" for name in self.foreign_libraries()]
        if self.numpy_bridges:
            found.append("crosses into numpy (" + ", ".join(sorted(self.numpy_bridges)) + ")")
        return found


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
        self.proc = CandidateProcess(self.task.memory_limit_mb, read_only=[shared])
        try:
            return self._run(shared)
        except _CandidateFailed as e:
            return self.reject(str(e))
        finally:
            self.report.stdout_bytes = self.proc.stdout_bytes()
            self.proc.remove()

    # ----------------------------------------------------------------------------------------
    def _run(self, shared: Path) -> ValidationReport:
        cand = self.task.candidate
        status = get_backend(cand.backend).status()
        art, card = open_card(Repository(self.task.repo), self.task.card_id)
        device = self.task.device or card.device
        if device.startswith("cuda") and not torch.cuda.is_available():
            device = "cpu"

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
        for seed in self.task.seeds:
            for dist in self.task.distributions:
                a, k = fresh_inputs(base_args, base_kwargs, seed, dist)
                cases.append((f"{dist} inputs, seed {seed}", a, k))

        self.stage("check")
        for n, (label, args, kwargs) in enumerate(cases):
            problem = self.check_case(op, args, kwargs, inplace, label, settle=n in (0, len(cases) - 1))
            if problem:
                return self.reject(problem)
        self.report.ran = True
        self.report.correct = True

        if self.task.time:
            if not status.can_time:
                self.report.timing_note = status.why
            else:
                self.stage("time")
                self.time_it(op, base_args, base_kwargs, card, device)
                self.stage("recheck")
                # new values into the very buffers the timed calls used: a result kept per pointer is stale now
                a, k = fresh_inputs(base_args, base_kwargs, 9973, "normal")
                problem = self.check_case(op, a, k, inplace, "fresh values in the timed buffers after timing",
                                          settle=True)
                if problem:
                    return self.reject(problem)
        self.report.stage = "done"
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
            self.report.verdict = "custom"
            self.report.reason = "correct on every captured and fresh input; computes the result itself"
        return self.report

    def _publish(self, loaded: Loaded, shared: Path) -> Path | None:
        """The candidate's extension file -- a fresh build in its scratch folder (then published to
        the shared cache) or a published one -- or None when the claimed path is elsewhere."""
        if not loaded.library or not loaded.build_name:
            return None
        path = Path(loaded.library).resolve()
        home = self.proc.scratch.resolve() if loaded.fresh_build else shared.resolve()
        if not path.is_relative_to(home) or not path.is_file():
            return None
        if loaded.fresh_build:
            build_cache.publish_build(shared, loaded.build_name, path)
        return path

    def _evidence(self, scanned: bool) -> str:
        parts = ["aten ops recorded by the profiler in the candidate's process, all threads (reported by that "
                 "process, so a candidate that disables profiling there could hide them)"]
        if scanned:
            parts.append("the extension's imported library symbols, read by the checker (vendor libraries and "
                         "ATen kernels called past the dispatcher)")
        parts.append(FOREIGN_EVIDENCE)
        parts.append(NOT_SEEN)
        return "; ".join(parts)

    def check_case(self, op, args: list, kwargs: dict, inplace: bool, label: str, settle: bool = False) -> str | None:
        """None when the candidate is right on this case, else why not. With ``settle``, the outputs
        are read again :data:`DELAY_S` after the call returned (anything still writing them fails)."""
        ref_args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        ref_kwargs = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        want = _tensors(op(*ref_args, **ref_kwargs))
        result = self.call(args, kwargs, want, trace=True, label=label)
        if result.ops is None:
            self.traced = False
        else:
            self.ops.update(_computing_ops(result.ops))
        got = [g.to(w.device) if g.device != w.device else g for g, w in zip(result.outputs, want)]
        got += result.outputs[len(want):]
        if not self.check(f"output structure ({label})", len(got) == len(want),
                          f"{len(got)} tensors returned, {len(want)} expected"):
            return f"returns {len(got)} tensor(s) where the operator returns {len(want)} ({label})"
        for i, j in enumerate(result.aliases):
            if j is not None and not (inplace and j == 0):
                self.check(f"no aliasing ({label})", False, f"output {i} shares memory with input {j}")
                return f"output {i} is (a view of) input {j}: kernels must write their own output ({label})"
        arena = self.proc.arena
        tensor_inputs = [a for a in [*args, *kwargs.values()] if isinstance(a, torch.Tensor)]
        for i, (slot, before) in enumerate(result.inputs):
            if not (inplace and i == 0) and not _same_bits(arena.read(slot), before):
                self.check(f"inputs unchanged ({label})", False, f"input {i} modified")
                return f"mutates input {i} ({label}); kernels must not modify their inputs"
        if inplace and result.inputs and tensor_inputs:  # the operator's contract is to update its first argument
            got = [arena.read(result.inputs[0][0]).to(want[0].device)] + got[1:]
            want = [ref_args[0]] + want[1:]
        problem = self._compare(op, args, kwargs, inplace, got, want, label)
        if problem:
            return problem
        if not settle:
            return None
        time.sleep(DELAY_S)
        for i, (slot, g) in enumerate(zip(result.output_slots, result.outputs)):
            if not _same_bits(arena.read(slot), g):
                self.check(f"output {i} stable ({label})", False, "changed after the call returned")
                return f"output {i} changed {DELAY_S:g} s after the call returned ({label}): something writes it late"
        return None

    def _compare(self, op, args, kwargs, inplace, got, want, label) -> str | None:
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

    def time_it(self, op, args: list, kwargs: dict, card: OpCard, device: str) -> None:
        """Eager timed here while the candidate process is stopped; the candidate timed by this
        process's clock around batches of calls it makes in its own process."""
        min_run = self.task.min_run_time
        want = _tensors(op(*args, **kwargs))
        self.call(args, kwargs, want, trace=False, label="timing inputs")
        eager, cand = self.time_rounds(lambda: op(*args, **kwargs), device, min_run)
        self.report.eager, self.report.candidate = eager, cand
        self.report.speedup_vs_eager = eager.median_s / cand.median_s
        if self.task.compile_baseline:
            compiled = torch.compile(lambda *a: op(*a, **kwargs), dynamic=False)
            compiled(*args)
            ct = time_callable(lambda: compiled(*args), device, min_run_time=min_run / 2)
            self.report.compiled_baseline = ct
            self.report.speedup_vs_compile = ct.median_s / cand.median_s
        self.report.timing_note = (f"eager: {eager.timer}; candidate: {cand.timer}; medians of the faster of two "
                                   f"interleaved rounds each; {eager.threads} threads; {eager.cache}")
        self.report.flags.extend(speedup_flags(eager, cand, self.report.compiled_baseline))
        if card.kind == "memory" and card.bytes_per_call:
            from modulelens.profiling.bandwidth import copy_bandwidth

            floor = card.bytes_per_call / copy_bandwidth(device)["bytes_per_s"]
            if cand.median_s < 0.5 * floor and card.bytes_per_call > 8 << 20:
                self.report.flags.append(
                    f"suspicious: {cand.median_s * 1e6:.1f} us is under half the {floor * 1e6:.1f} us this machine "
                    f"needs to move {card.bytes_per_call} bytes")


def checker_timing(proc: CandidateProcess, device: str, min_run_time: float, timeout: float,
                   warmup: int = 3) -> Timing:
    """Per-call seconds of the candidate's last call, measured by this process's clock around
    batches of calls (each batch >= 20 ms, so the pipe round trip is a small part of it)."""
    proc.time_calls(warmup, timeout)
    one = proc.time_calls(1, timeout)
    batch = max(1, min(100_000, int(0.02 / max(one, 1e-9))))
    samples: list[float] = []
    spent = 0.0
    while spent < min_run_time or len(samples) < 5:
        per_call = proc.time_calls(batch, timeout)
        samples.append(per_call)
        spent += per_call * batch
        if len(samples) >= 200:
            break
    samples.sort()
    pick = lambda q: samples[min(len(samples) - 1, int(q * len(samples)))]  # noqa: E731
    return Timing(median_s=statistics.median(samples), p20_s=pick(0.2), p80_s=pick(0.8), runs=len(samples) * batch,
                  samples=len(samples), warmup=warmup,
                  timer=f"checker's perf_counter around {batch} call(s) per sample in the candidate process",
                  device=device, threads=torch.get_num_threads(), cache="warm (CPU caches are not flushed between calls)")


def _computing_ops(names: list[str]) -> list[str]:
    """The aten ops among ``names`` that compute (not allocation, copies, views or metadata)."""
    out = []
    for name in names:
        if not name.startswith("aten::"):
            continue
        base = name.split("::", 1)[1].split(".")[0]
        if base in _ALLOWED:
            continue
        packet = getattr(torch.ops.aten, base, None)
        overload = getattr(packet, "default", None) if packet is not None else None
        if overload is not None and classify(overload) == "view":
            continue
        out.append(name)
    return out


def library_symbols(library: Path) -> list[str]:
    """Vendor-library and past-the-dispatcher ATen symbols the extension file imports (read with
    ``nm`` by the checker, not reported by the candidate)."""
    nm = shutil.which("nm")
    if not nm:
        return []
    try:
        text = subprocess.run([nm, "-D", "--undefined-only", "-C", str(library)], capture_output=True, text=True,
                              timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    found = set()
    for line in text.splitlines():  # "                 U at::cpu::_softmax(at::Tensor const&, long, bool)"
        sym = line.strip().partition(" ")[2].strip()
        m = _LIBRARY_SYMBOL.match(sym)
        if m:
            found.add(m.group(0))
    return sorted(found)


def _clean_tail(text: str) -> str:
    """A stderr tail safe to show: control characters other than newline and tab removed."""
    return "".join(c for c in text if c in "\n\t" or c.isprintable())[-1500:]


def time_candidate(task: TimeCandidateTask) -> Timing:
    """Time a candidate alone on its card's first captured sample (for ``profile``), by the
    checker's clock around calls made in the candidate's own process."""
    cand = task.candidate
    status = get_backend(cand.backend).status()
    if not (status.can_run and status.can_time):
        raise ModuleLensError(f"{cand.backend} candidates cannot be timed here: {status.why}",
                              "profile it on a machine with the right device")
    art, card = open_card(Repository(task.repo), task.card_id)
    device = task.device or card.device
    args, kwargs, _, _ = sample_call(art, card, 0, device=device)
    settings = ValidateCardTask(repo=task.repo, candidate=cand, build_dir=task.build_dir, card_id=task.card_id,
                                device=device, time=False)
    checker = _Validator(settings, lambda _: None)
    checker.proc = CandidateProcess(settings.memory_limit_mb, read_only=[Path(task.build_dir)])
    try:
        loaded = checker._request(LoadRequest(candidate=cand, build_dir=str(checker.proc.scratch / "build"),
                                              shared_build_dir=task.build_dir), timeout=settings.build_timeout)
        if not loaded.ok:
            raise ModuleLensError(f"the candidate does not compile: {loaded.error}", "fix it and validate it first")
        checker._publish(loaded, Path(task.build_dir))
        want = _tensors(resolve_op(card.op)(*args, **kwargs))
        checker.call(args, kwargs, want, trace=False, label="the first sample")
        return checker_timing(checker.proc, device, task.min_run_time, settings.call_timeout, task.warmup)
    except _CandidateFailed as e:
        raise ModuleLensError(f"the candidate failed while being timed: {e}", "validate it first") from None
    finally:
        checker.proc.remove()

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
        return ValidatedResult(report=validate_card(task, stage))
    return PongResult()
