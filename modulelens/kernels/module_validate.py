"""Validate a module-level candidate (``ModelNew``) against its capture. Runs inside a sandbox worker.

The same checks as card candidates (:mod:`modulelens.kernels.validate`), on the whole module:
loads (its source runs, and may compile C++); is built with the captured constructor arguments and
takes the captured weights by name (``load_state_dict(strict=True)``); then, in eval mode without
grad, outputs on the captured inputs and on fresh inputs (seeds x normal, uniform, heavy-tailed,
special values) match the original module's, inputs are not mutated and outputs do not alias them.

Training mode (only for a candidate that claims training support, and a capture made in
training mode): dropout is checked **with the same RNG state**: the CPU/CUDA generators are set
to the same state before the original and the candidate run, so a candidate that draws its
dropout masks like eager (same operators, same order) gets the same masks. On the captured
inputs the output must also match the captured output (the capture stored the RNG state before
the call). Gradients: with captured gradients (``--backward``), the candidate's parameter and
input gradients for the captured output gradient must match the captured ones; without, they
must match the original module's for a random output gradient. A candidate that does not claim
training support is checked in eval mode only, and the verdict says so.

Timing: the original module against the candidate in the mode the candidate is packed for
(forward only: training with grad for a training candidate, else eval without grad), in
back-to-back pairs of calls: the speedup is the median of the pairs' ratios.

Containment: unlike card candidates (which run in their own contained candidate process, see
:mod:`modulelens.sandbox.candidate_process`), a module candidate runs in the sandbox worker itself,
beside the original module, the comparison, the clock and the verdict. In force: the worker's own
limits (allow-listed environment, scratch folder, rlimits) and a fresh worker after every module
candidate; not in force: process separation, namespaces, private /tmp, Landlock, seccomp. The
report's ``isolation``, a flag and the verdict's reason say so; timers replaced by the candidate
are checked (:func:`changed_timers`), since the candidate shares the clock's process.
"""

from __future__ import annotations

import resource
import time
import timeit
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from modulelens.kernels.report import ValidationReport
from modulelens.kernels.validate import _computing_ops, _overlaps, _same_bits, _tensors, compare_output, fresh_inputs
from modulelens.kernels.verdict_keeping import ReportKeeper
from modulelens.profiling import timing as timing_module
from modulelens.profiling.paired import paired_timing  # imported before candidate code runs: its timer is the real one
from modulelens.sandbox.containment import Isolation
from modulelens.sandbox.messages import ValidatedResult, ValidateModuleTask

EVAL_ONLY = "checked in eval mode only (dropout off, no gradients): not dispatched in training"
SAME_RNG = ("training mode checked with the same RNG state before the original and the candidate "
            "(dropout masks agree when drawn like eager)")


UNCONTAINED = "ran uncontained in the sandbox worker (no candidate process)"
NOT_CONTAINED = ("not contained like card candidates: the module candidate runs inside the sandbox worker, in the "
                 "same process as the original module, the comparison, the clock and the verdict (no separate "
                 "candidate process, no namespaces, no Landlock)")

# What the timers are before any candidate code runs: the candidate shares this process, so one that
# replaces a timer is rejected.
_TIMERS: dict[str, Callable[[], Any]] = {
    "time.perf_counter": lambda: time.perf_counter,
    "time.perf_counter_ns": lambda: time.perf_counter_ns,
    "time.monotonic": lambda: time.monotonic,
    "time.time": lambda: time.time,
    "timeit.default_timer": lambda: timeit.default_timer,
    "torch.cuda.synchronize": lambda: torch.cuda.synchronize,
    "torch.cuda.Event.elapsed_time": lambda: torch.cuda.Event.elapsed_time,
    "modulelens.profiling.timing.time_callable": lambda: timing_module.time_callable,
}
_ORIGINAL_TIMERS = {name: get() for name, get in _TIMERS.items()}


def changed_timers() -> list[str]:
    """The timers (see ``_TIMERS``) that are no longer what they were when this module was imported."""
    out = []
    for name, get in _TIMERS.items():
        try:
            if get() is not _ORIGINAL_TIMERS[name]:
                out.append(name)
        except Exception:  # noqa: BLE001 - a timer that vanished counts as replaced
            out.append(name)
    return out


class _AtenCallCounter(TorchDispatchMode):
    """Counts the aten operators called under it that compute (allocation, copies, views and
    metadata are not counted; see ``validate._computing_ops``)."""

    def __init__(self):
        super().__init__()
        self.calls: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if _computing_ops([func.name()]):
            self.calls[str(func)] = self.calls.get(str(func), 0) + 1  # aten.sum.default, as before
        return func(*args, **(kwargs or {}))


def worker_isolation() -> Isolation:
    """What is in force around a module candidate: the sandbox worker process only (read from this
    process where it can be: the address-space limit)."""
    iso = Isolation()
    iso.add("process separation", False, "the candidate runs in the sandbox worker, beside the original module, "
            "the comparison, the clock and the verdict")
    iso.add("sandbox worker", True, "a separate worker process: environment reduced to an allow-list, scratch folder "
            "as working directory, HOME and TMPDIR, output to files; replaced after every module candidate")
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    iso.add("rlimits", True, "core dumps off, " + (f"{limit >> 20} MiB address space" if limit != resource.RLIM_INFINITY
                                                  else "no address-space cap (GPU run)"))
    iso.add("namespaces", False, "not applied to module candidates: they see other processes and the network")
    iso.add("private /tmp", False, "not applied to module candidates")
    iso.add("landlock", False, "not applied to module candidates: they can read and write every file the user can")
    iso.add("seccomp", False, "not applied")
    return iso


class _ModuleValidator(ReportKeeper):
    """The report, checks and stages of one module candidate's validation, and the module checks."""

    def __init__(self, task: ValidateModuleTask, stage: Callable[[str], None]):
        self.task = task
        self.stage_cb = stage
        self.report = ValidationReport(verdict="rejected", correct=False, reason="", stage="compile", backend="module",
                                       isolation=worker_isolation(), flags=[NOT_CONTAINED])
        self.rtol, self.atol = task.rtol, task.atol
        self.calls: dict[str, int] = {}

    # ------------------------------------------------------------------------------------------
    def run(self) -> ValidationReport:
        from modulelens.capture.artifact import load_tensors
        from modulelens.capture.manifest import capture_manifest
        from modulelens.capture.replay import LoadedCapture
        from modulelens.kernels.module_candidates import construct, load_class
        from modulelens.repo import Repository

        cand = self.task.candidate
        art = Repository(self.task.repo).open("captures", self.task.capture)
        manifest = capture_manifest(art)
        device = manifest.environment.device if torch.cuda.is_available() else "cpu"
        loaded = LoadedCapture(art, device=device)
        self.stage("compile")
        try:
            cls = load_class(cand.source, cand.class_name)
        except Exception as e:  # noqa: BLE001 - a source that fails to load is a verdict
            self.report.errors = [_load_error(e)]
            self.check("loads", False, self.report.errors[0])
            return self.reject(f"does not load: {self.report.errors[0]}")
        self.report.compiled = True
        self.check("loads", True)
        tampered = changed_timers()
        if tampered:
            return self.reject(f"replaces timer functions when loaded: {', '.join(tampered)}")
        if "source" not in manifest.strategies or manifest.init is None:
            return self.reject(f"capture {art.ref} has no constructor arguments: ModelNew cannot be built like the module")
        reference = loaded.build("source")
        tensors = load_tensors(art, "init.safetensors") if art.has_file("init.safetensors") else {}
        try:
            new = construct(cls, manifest.init.args, manifest.init.kwargs, tensors, manifest.sys_path)
            new = new.to(device)
            new.load_state_dict(reference.state_dict(), strict=True)
        except Exception as e:  # noqa: BLE001
            first = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
            self.check("builds with the captured constructor arguments and weights", False, first)
            return self.reject(f"cannot be built with the captured constructor arguments and weights: {first}")
        self.check("builds with the captured constructor arguments and weights", True)

        args, kwargs = loaded.inputs()
        expected, _ = loaded.expected_outputs()
        cases = [("captured inputs", args, kwargs)]
        for seed in self.task.seeds:
            for dist in self.task.distributions:
                a, k = fresh_inputs(args, kwargs, seed, dist)
                cases.append((f"{dist} inputs, seed {seed}", a, k))
        claims = cand.claims_training and manifest.training
        self.stage("check")
        reference.eval()
        new.eval()
        with torch.no_grad():
            for label, a, k in cases:
                problem = self.check_case(reference, new, a, k, f"eval, {label}", rng=None)
                if problem:
                    return self.reject(problem)
        notes = [EVAL_ONLY if not claims else SAME_RNG, UNCONTAINED]
        if claims:
            problem = self.check_training(loaded, reference, new, cases, expected)
            if problem:
                return self.reject(problem)
        self.report.ran, self.report.correct = True, True
        self.report.backend_calls = sorted(self.calls)
        if self.task.time:
            self.stage("time")
            self.time_it(reference, new, args, kwargs, claims, device)
            tampered = changed_timers()
            if tampered:
                self.report.correct = False
                return self.reject(f"replaced timer functions while running: {', '.join(tampered)}")
            self.stage("recheck")
            with torch.no_grad():
                problem = self.check_case(reference.eval(), new.eval(), args, kwargs, "captured inputs after timing", None)
            if problem:
                self.report.correct = False
                return self.reject(problem)
        self.report.stage = "done"
        if self.report.backend_calls:
            self.report.verdict = "wrapper"
            self.report.reason = ("correct, and computes through " + ", ".join(self.report.backend_calls[:5])
                                  + (" ..." if len(self.report.backend_calls) > 5 else "") + "; " + notes[0] + "; " + notes[1])
        else:
            self.report.verdict = "custom"
            self.report.reason = "correct on the captured and fresh inputs; computes the result itself; " + notes[0] + "; " + notes[1]
        self.report.timing_note = (self.report.timing_note + "; " if self.report.timing_note else "") + notes[0]
        return self.report

    def _run(self, module: torch.nn.Module, a: list, k: dict, rng: dict | None, count: bool) -> Any:
        from modulelens.capture.tracer import set_rng_states

        if rng is not None:
            set_rng_states(rng)
        if not count:
            return module(*a, **k)
        counter = _AtenCallCounter()
        with counter:
            out = module(*a, **k)
        for name, n in counter.calls.items():
            self.calls[name] = self.calls.get(name, 0) + n
        return out

    def compare(self, got: Any, want: Any, label: str, rtol: float | None = None) -> str | None:
        g, w = _tensors(got), _tensors(want)
        if not self.check(f"output structure ({label})", len(g) == len(w), f"{len(g)} tensors, {len(w)} expected"):
            return f"returns {len(g)} tensor(s) where the module returns {len(w)} ({label})"
        for i, (x, y) in enumerate(zip(g, w)):
            ok, detail = compare_output(x.detach().to(y.device), y.detach(), rtol if rtol is not None else self.rtol,
                                        self.atol)
            if not self.check(f"output {i} values ({label})", ok, detail):
                return f"output {i} is wrong on {label}: {detail}"
        return None

    def check_case(self, reference: torch.nn.Module, new: torch.nn.Module, args: list, kwargs: dict, label: str,
                   rng: dict | None) -> str | None:
        want = self._run(reference, [a.clone() if isinstance(a, torch.Tensor) else a for a in args], dict(kwargs), rng, False)
        cand_args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        snapshot = [a.clone() if isinstance(a, torch.Tensor) else None for a in cand_args]
        try:
            got = self._run(new, cand_args, dict(kwargs), rng, True)
        except Exception as e:  # noqa: BLE001 - any exception from the candidate is a verdict
            text = str(e).strip().splitlines()
            self.report.errors.append(f"{type(e).__name__}: {text[0][:500] if text else ''}")
            return f"raised {type(e).__name__} on {label}: {text[0][:300] if text else ''}"
        for i, out in enumerate(_tensors(got)):
            for j, a in enumerate(cand_args):
                if isinstance(a, torch.Tensor) and _overlaps(out, a):
                    self.check(f"no aliasing ({label})", False, f"output {i} shares memory with input {j}")
                    return f"output {i} is (a view of) input {j} ({label})"
        for i, (a, snap) in enumerate(zip(cand_args, snapshot)):
            if snap is not None and not _same_bits(a, snap):
                self.check(f"inputs unchanged ({label})", False, f"input {i} modified")
                return f"mutates input {i} ({label})"
        return self.compare(got, want, label)

    def check_training(self, loaded: Any, reference: torch.nn.Module, new: torch.nn.Module, cases: list,
                       expected: Any) -> str | None:
        from modulelens.capture.tracer import rng_states

        reference.train()
        new.train()
        captured_rng = loaded.rng()
        with torch.enable_grad():
            for label, a, k in cases:
                rng = captured_rng if label == "captured inputs" else rng_states()
                problem = self.check_case(reference, new, a, k, f"training, same RNG state, {label}", rng)
                if problem:
                    return problem
            got = self._run(new, *cases[0][1:], captured_rng, False)
            problem = self.compare(got, expected, "training, captured RNG state, against the captured output")
            if problem:
                return problem
            return self.check_gradients(loaded, reference, new, cases[0][1], cases[0][2], captured_rng)

    def check_gradients(self, loaded: Any, reference: torch.nn.Module, new: torch.nn.Module, args: list, kwargs: dict,
                        rng: dict) -> str | None:
        grads = loaded.grads() if loaded.artifact.has_file("grads.safetensors") else {}

        def backward(module: torch.nn.Module, grad_out: list[torch.Tensor] | None) -> tuple[list, dict, list]:
            a = [x.detach().clone().requires_grad_(x.is_floating_point()) if isinstance(x, torch.Tensor) else x
                 for x in args]
            module.zero_grad(set_to_none=True)
            outs = [o for o in _tensors(self._run(module, a, dict(kwargs), rng, False)) if o.requires_grad]
            if grad_out is None:
                gen = torch.Generator().manual_seed(0)
                grad_out = [torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.dtype) for o in outs]
            torch.autograd.backward(outs, [g.to(o.device, o.dtype) for g, o in zip(grad_out, outs)])
            params = {n: p.grad for n, p in module.named_parameters() if p.grad is not None}
            return [x.grad for x in a if isinstance(x, torch.Tensor)], params, grad_out

        captured_out = [grads[k] for k in sorted((k for k in grads if k.startswith("grad_output.")), key=_index)]
        if captured_out:
            label = "gradients, against the captured gradients"
            inputs, params, _ = backward(new, captured_out)
            want_params = {k.removeprefix("param."): v for k, v in grads.items() if k.startswith("param.")}
            want_inputs = {int(k.split(".")[1]): v for k, v in grads.items() if k.startswith("grad_input.")}
        else:
            label = "gradients, against the original module (no captured gradients)"
            ref_inputs, want_params, grad_out = backward(reference, None)
            inputs, params, _ = backward(new, grad_out)
            want_inputs = {i: g for i, g in enumerate(ref_inputs) if g is not None}
        for name, want in want_params.items():
            if name not in params:
                self.check(f"{label}: {name}", False, "no gradient")
                return f"parameter {name} gets no gradient ({label})"
            problem = self.compare(params[name], want, f"{label}: {name}", rtol=self.rtol or 1e-4)
            if problem:
                return problem
        for i, want in want_inputs.items():
            if i < len(inputs) and inputs[i] is not None:
                problem = self.compare(inputs[i], want, f"{label}: input {i}", rtol=self.rtol or 1e-4)
                if problem:
                    return problem
        return None

    def time_it(self, reference: torch.nn.Module, new: torch.nn.Module, args: list, kwargs: dict, training: bool,
                device: str) -> None:
        """Paired timing (:mod:`modulelens.profiling.paired`): the speedup is the median ratio of
        back-to-back pairs of calls, so load that drifts over the run hits both sides alike."""
        reference.train(training)
        new.train(training)

        def run(module: torch.nn.Module) -> Callable[[], Any]:
            def call() -> Any:
                with torch.set_grad_enabled(training):
                    return module(*args, **kwargs)
            return call

        eager, cand, ratio, pairs = paired_timing(run(reference), run(new), device,
                                                  min_run_time=self.task.min_run_time)
        self.report.eager, self.report.candidate, self.report.speedup_vs_eager = eager, cand, ratio
        mode = "training mode with grad (forward)" if training else "eval mode without grad"
        self.report.timing_note = (f"module forward in {mode}; speedup is the median ratio of {pairs} "
                                   f"back-to-back pairs of calls; {eager.threads} threads")
        if ratio > 10:
            self.report.flags.append(f"suspicious: {ratio:.1f}x faster than eager")


def _load_error(e: BaseException) -> str:
    """Short text of a load failure: the first compiler errors of a failed C++ build, else the
    exception's first line."""
    from modulelens.kernels.backends.cpp import summarize_errors

    text = str(e)
    if "error:" in text:
        return f"{type(e).__name__}: " + summarize_errors(text, {"main.cpp": (0, 1 << 30)})
    lines = text.strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:500] if lines else ''}"


def _index(key: str) -> int:
    return int(key.rsplit(".", 1)[1])


def run_task(task: ValidateModuleTask, stage: Callable[[str], None]) -> ValidatedResult:
    """The sandbox worker's entry for ``validate_module`` tasks (``validate.run_task``'s counterpart):
    the report of the module candidate (see the module docstring). The candidate's code ran in this
    worker, which is also the checker of card candidates, so the worker always reports itself unfit
    for reuse and the pool replaces it."""
    from modulelens.errors import ModuleLensError

    t0 = time.perf_counter()
    try:
        report = _ModuleValidator(task, stage).run()
    except ModuleLensError as e:
        report = ValidationReport(verdict="rejected", correct=False, reason=str(e), stage="setup", backend="module",
                                  isolation=worker_isolation(), flags=[NOT_CONTAINED])
    report.seconds = time.perf_counter() - t0
    return ValidatedResult(report=report, healthy=False)
