"""Validate a module-level candidate (``ModelNew``) against its capture. Runs inside a sandbox worker
(the checker); the candidate's code runs in its own contained candidate process.

The same checks as card candidates (:mod:`modulelens.validation.card`), on the whole module:
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

Containment: like card candidates. The checker (this worker) holds the capture, the original
module, the reference outputs, the clock and the verdict; it writes the original's state dict and
the constructor's tensors into the candidate's scratch folder, and the candidate process
(:mod:`modulelens.validation.harness`: namespaces, private /tmp, rlimits, Landlock where the kernel
allows) builds ``ModelNew`` from them and is called through the shared arena. It may read only
system and Python folders, its scratch, the build cache and the capture's ``sys_path`` folders that
hold neither the repository nor the signing key (the constructor's argument classes import from
there): the report's ``isolation`` says what was in force, including whether the signing key and
the repository were out of reach.

Timing: the original module runs in a reference process started and served exactly like the
candidate's (the same harness loads the captured class by its class path, built with the same
constructor arguments and weights), and both are timed by this process's clock through the same
request in interleaved rounds (:mod:`modulelens.validation.timed`), in the mode the candidate is
packed for (training with grad for a training candidate, forward only, the same RNG state set
before every call on both sides; else eval without grad). The candidate's timed outputs are
checked on a random sample of batches.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

from modulelens.timing import thread_choice
from modulelens.validation.candidate_messages import Loaded, LoadModuleRequest
from modulelens.validation.checker import CandidateChecker, CandidateFailed, ModuleCall, start_candidate
from modulelens.validation.compare import compare_output, same_bits
from modulelens.validation.evidence import FOREIGN_EVIDENCE, NOT_SEEN, computing_ops
from modulelens.validation.inputs import fresh_inputs, tensors
from modulelens.validation.messages import ValidatedResult, ValidateModuleTask
from modulelens.validation.report import ValidationReport
from modulelens.validation.timed import (
    ReferenceFailed,
    TimedProcess,
    TimingFeed,
    load_reference,
    time_against,
    timing_plan,
)

EVAL_ONLY = "checked in eval mode only (dropout off, no gradients): not dispatched in training"
SAME_RNG = ("training mode checked with the same RNG state before the original and the candidate "
            "(dropout masks agree when drawn like eager)")
CONTAINED = "ran in its own contained candidate process (see isolation)"


def readable_sys_path(sys_path: list[str], repo_root: Path) -> list[Path]:
    """The capture's ``sys_path`` folders a module candidate may read (its constructor's argument
    classes import from them): existing folders that are not the repository, the signing key's
    folder or the home folder, nor hold any of them."""
    from modulelens.repo.trust import config_dir

    secret = [Path(os.path.realpath(p)) for p in (repo_root, config_dir(), Path.home())]
    out = []
    for p in sys_path:
        real = Path(os.path.realpath(p)) if p else None
        if real is None or not real.is_dir() or any(s.is_relative_to(real) for s in secret):
            continue
        if any(real.is_relative_to(s) for s in secret[:2]):
            continue
        out.append(real)
    return out


class _ModuleValidator(CandidateChecker):
    """The checker of one module candidate: the capture, the original module, the reference
    outputs, the clock and the verdict stay here; the candidate runs in a :class:`CandidateProcess`."""

    def __init__(self, task: ValidateModuleTask, stage: Callable[[str], None]):
        self.task = task
        self.stage_cb = stage
        self.report = ValidationReport(verdict="rejected", correct=False, reason="", stage="compile", backend="module")
        self.rtol, self.atol = task.rtol, task.atol
        self.call_timeout = task.call_timeout
        self.ops: set[str] = set()
        self.numpy_bridges: set[str] = set()

    def run(self) -> ValidationReport:
        from modulelens.capture.manifest import capture_manifest
        from modulelens.capture.replay import LoadedCapture
        from modulelens.repo import Repository

        repo = Repository(self.task.repo)
        art = repo.open("captures", self.task.capture)
        manifest = capture_manifest(art)
        device = manifest.environment.device if torch.cuda.is_available() else "cpu"
        loaded = LoadedCapture(art, device=device)
        conf = self.task.confinement  # the caller's list: it knows where the key and the home folder are
        folders = [Path(p) for p in conf.readable] if conf else readable_sys_path(manifest.sys_path, repo.root)
        read_only = [Path(self.task.build_dir), *folders]
        self.threads = thread_choice()
        self.proc = start_candidate(self.task.memory_limit_mb, read_only=read_only)
        self.reference_proc = None  # the original module's own process, started when checks begin
        try:
            return self._run(art, manifest, loaded, device)
        except CandidateFailed as e:
            return self.reject(str(e))
        finally:
            self.report.stdout_bytes = self.proc.stdout_bytes()
            self.proc.remove()
            if self.reference_proc is not None:
                self.reference_proc.remove()

    def _load(self, art: Any, manifest: Any, reference: torch.nn.Module, device: str) -> Loaded:
        """Write the weights and the constructor's tensors into the candidate's scratch folder and
        have the candidate process load and build ``ModelNew`` from them."""
        from safetensors.torch import save_file

        from modulelens.capture.artifact import load_tensors

        state = self.proc.scratch / "state.safetensors"
        save_file({k: v.detach().cpu().contiguous().clone() for k, v in reference.state_dict().items()}, str(state))
        init = None
        if art.has_file("init.safetensors"):
            init = self.proc.scratch / "init.safetensors"
            save_file({k: v.contiguous() for k, v in load_tensors(art, "init.safetensors").items()}, str(init))
        self.get_ready("module")
        req = LoadModuleRequest(source=self.task.candidate.source, class_name=self.task.candidate.class_name,
                                init_args=list(manifest.init.args or []), init_kwargs=dict(manifest.init.kwargs or {}),
                                init_tensors=str(init) if init else None, state=str(state),
                                sys_path=[str(p) for p in self.proc.read_only[1:]], device=device,
                                shared_build_dir=self.task.build_dir)
        loaded = self._request(req, timeout=self.task.build_timeout)
        if loaded.ok:
            self.publish_extensions(loaded, self.task.candidate.source, Path(self.task.build_dir))
        return loaded

    def _run(self, art: Any, manifest: Any, loaded: Any, device: str) -> ValidationReport:
        cand = self.task.candidate
        if "source" not in manifest.strategies or manifest.init is None:
            return self.reject(f"capture {art.ref} has no constructor arguments: ModelNew cannot be built like the module")
        reference = loaded.build("source")
        self.stage("compile")
        result = self._load(art, manifest, reference, device)
        self.report.isolation = self._isolation(result, Path(self.task.repo))
        if not result.ok and result.failed_step == "load":
            self.report.errors = [result.error]
            self.check("loads", False, result.error)
            return self.reject(f"does not load: {result.error}")
        self.report.compiled = True
        self.check("loads", True)
        if not self.check("builds with the captured constructor arguments and weights", result.ok, result.error):
            return self.reject(f"cannot be built with the captured constructor arguments and weights: {result.error}")

        if self.task.time:  # started now, so that its start overlaps the checks
            self.reference_proc = start_candidate(self.task.memory_limit_mb, read_only=list(self.proc.read_only))
        args, kwargs = loaded.inputs()
        expected, _ = loaded.expected_outputs()
        cases = [("captured inputs", args, kwargs)]
        for seed in self.task.seeds:
            for dist in self.task.distributions:
                a, k = fresh_inputs(args, kwargs, seed, dist)
                cases.append((f"{dist} inputs, seed {seed}", a, k))
        claims = cand.claims_training and manifest.training
        self.stage("check")
        for label, a, k in cases:
            problem = self.check_case(reference, a, k, f"eval, {label}", training=False, rng=None)
            if problem:
                return self.reject(problem)
        note = EVAL_ONLY if not claims else SAME_RNG
        if claims:
            problem = self.check_training(loaded, reference, cases, expected)
            if problem:
                return self.reject(problem)
        self.report.ran, self.report.correct = True, True
        if self.task.time:
            self.stage("time")
            self.time_it(reference, args, kwargs, claims, device, art, manifest)
            self.stage("recheck")
            a, k = fresh_inputs(args, kwargs, 9973, "normal")
            problem = self.check_case(reference, a, k, "fresh values in the timed buffers after timing",
                                      training=False, rng=None)
            if problem:
                self.report.correct = False
                return self.reject(problem)
        self.report.stage = "done"
        self.report.timing_note = (self.report.timing_note + "; " if self.report.timing_note else "") + note
        return self._decide(note)

    def _decide(self, note: str) -> ValidationReport:
        foreign = self.foreign_evidence()
        self.report.backend_calls = sorted(self.ops) + foreign
        self.report.wrapper_evidence = "; ".join([
            "aten ops recorded by the profiler in the candidate's process during its forward calls, all threads "
            "(reported by that process)", FOREIGN_EVIDENCE, NOT_SEEN])
        if foreign:
            self.report.verdict = "wrapper"
            self.report.reason = f"correct, but it computes with a foreign library: {'; '.join(foreign)}; {note}"
        elif self.ops:
            calls = sorted(self.ops)
            self.report.verdict = "wrapper"
            self.report.reason = ("correct, and computes through " + ", ".join(calls[:5])
                                  + (" ..." if len(calls) > 5 else "") + f"; {note}; {CONTAINED}")
        else:
            self.report.verdict = "custom"
            self.report.reason = f"correct on the captured and fresh inputs; computes the result itself; {note}; {CONTAINED}"
        return self.report

    def _reference(self, reference: torch.nn.Module, args: list, kwargs: dict, training: bool,
                   rng: dict | None) -> Any:
        from modulelens.capture.tracer import set_rng_states

        reference.train(training)
        if rng is not None:
            set_rng_states(rng)
        with torch.set_grad_enabled(training):
            return reference(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args], **dict(kwargs))

    def compare(self, got: Any, want: Any, label: str, rtol: float | None = None) -> str | None:
        g, w = tensors(got), tensors(want)
        if not self.check(f"output structure ({label})", len(g) == len(w), f"{len(g)} tensors, {len(w)} expected"):
            return f"returns {len(g)} tensor(s) where the module returns {len(w)} ({label})"
        for i, (x, y) in enumerate(zip(g, w)):
            ok, detail = compare_output(x.detach().to(y.device), y.detach(), rtol if rtol is not None else self.rtol,
                                        self.atol)
            if not self.check(f"output {i} values ({label})", ok, detail):
                return f"output {i} is wrong on {label}: {detail}"
        return None

    def check_case(self, reference: torch.nn.Module, args: list, kwargs: dict, label: str, training: bool,
                   rng: dict | None) -> str | None:
        want = tensors(self._reference(reference, args, kwargs, training, rng))
        result = self.call(args, kwargs, want, trace=True, label=label, module_call=ModuleCall(training, rng))
        self.ops.update(computing_ops(result.ops or []))
        for i, j in enumerate(result.aliases):
            if j is not None and j < len(result.inputs):
                self.check(f"no aliasing ({label})", False, f"output {i} shares memory with input {j}")
                return f"output {i} is (a view of) input {j} ({label})"
        for i, (slot, before) in enumerate(result.inputs):
            if not same_bits(self.proc.arena.read(slot), before):
                self.check(f"inputs unchanged ({label})", False, f"input {i} modified")
                return f"mutates input {i} ({label})"
        return self.compare(result.outputs, want, label)

    def check_training(self, loaded: Any, reference: torch.nn.Module, cases: list, expected: Any) -> str | None:
        from modulelens.capture.tracer import rng_states

        captured_rng = loaded.rng()
        for label, a, k in cases:
            rng = captured_rng if label == "captured inputs" else rng_states()
            problem = self.check_case(reference, a, k, f"training, same RNG state, {label}", training=True, rng=rng)
            if problem:
                return problem
        args, kwargs = cases[0][1], cases[0][2]
        want = tensors(expected)
        got = self.call(args, kwargs, want, trace=False, label="training, captured RNG state",
                        module_call=ModuleCall(True, captured_rng))
        problem = self.compare(got.outputs, expected, "training, captured RNG state, against the captured output")
        if problem:
            return problem
        return self.check_gradients(loaded, reference, args, kwargs, captured_rng)

    def check_gradients(self, loaded: Any, reference: torch.nn.Module, args: list, kwargs: dict,
                        rng: dict) -> str | None:
        grads = loaded.grads() if loaded.artifact.has_file("grads.safetensors") else {}
        captured_out = [grads[k] for k in sorted((k for k in grads if k.startswith("grad_output.")), key=_index)]
        if captured_out:
            label = "gradients, against the captured gradients"
            grad_out = captured_out
            want_params = {k.removeprefix("param."): v for k, v in grads.items() if k.startswith("param.")}
            want_inputs = {int(k.split(".")[1]): v for k, v in grads.items() if k.startswith("grad_input.")}
        else:
            label = "gradients, against the original module (no captured gradients)"
            ref_inputs, want_params, grad_out = _reference_backward(reference, args, kwargs, rng)
            want_inputs = {i: g for i, g in enumerate(ref_inputs) if g is not None}
        room = sum(p.numel() * p.element_size() + 64 for p in reference.parameters())
        room += sum(a.numel() * a.element_size() + 64 for a in args if isinstance(a, torch.Tensor))
        want = tensors(self._reference(reference, args, kwargs, True, rng))
        got = self.call(args, kwargs, want, trace=False, label=label,
                        module_call=ModuleCall(True, rng, [g.detach() for g in grad_out], grad_room=room))
        inputs, params = got.input_grads, got.param_grads
        for name, w in want_params.items():
            if name not in params:
                self.check(f"{label}: {name}", False, "no gradient")
                return f"parameter {name} gets no gradient ({label})"
            problem = self.compare(params[name], w, f"{label}: {name}", rtol=self.rtol or 1e-4)
            if problem:
                return problem
        for i, w in want_inputs.items():
            if i < len(inputs) and inputs[i] is not None:
                problem = self.compare(inputs[i], w, f"{label}: input {i}", rtol=self.rtol or 1e-4)
                if problem:
                    return problem
        return None

    def time_it(self, reference: torch.nn.Module, args: list, kwargs: dict, training: bool, device: str,
                art: Any, manifest: Any) -> None:
        """The original module (in its own reference process) against the candidate, in the mode
        the candidate is packed for (see the module docstring)."""
        from modulelens.capture.tracer import rng_states

        rng = rng_states() if training else None  # set before every timed call, on both sides
        module_call = ModuleCall(training, rng)
        want = tensors(self._reference(reference, args, kwargs, training, rng))
        self.call(args, kwargs, want, trace=False, label="timing inputs", module_call=module_call)
        mode = "training mode with grad (forward)" if training else "eval mode without grad"
        what = f"module forward in {mode} (fresh values per round)"
        feed = TimingFeed(args, kwargs)
        cand = TimedProcess(self, self.proc, "candidate", device, feed, want, module_call,
                            verify=self._verify_timed(reference, training, rng))
        plan = timing_plan(self.task.min_run_time, self.task.timing_budget_s, self.task.target_width)
        original = partial(self._original_side, art, manifest, reference, device, feed, want, args, kwargs, module_call)
        time_against(self, original, cand, plan, what, "original")
        if self.report.speedup_vs_eager is not None and self.report.speedup_vs_eager > 10:
            self.report.flags.append(f"suspicious: {self.report.speedup_vs_eager:.1f}x faster than eager")

    def _original_side(self, art: Any, manifest: Any, reference: torch.nn.Module, device: str, feed: TimingFeed,
                       want: list, args: list, kwargs: dict, module_call: ModuleCall) -> TimedProcess:
        """The reference process with the original module loaded (its captured class found as
        replay finds it, built with the captured constructor arguments and weights) and called once."""
        from safetensors.torch import save_file

        from modulelens.capture.artifact import load_tensors

        proc = self.reference_proc
        if proc is None:
            raise ReferenceFailed("no reference process")
        state = proc.scratch / "state.safetensors"
        save_file({k: v.detach().cpu().contiguous().clone() for k, v in reference.state_dict().items()}, str(state))
        init = None
        if art.has_file("init.safetensors"):
            init = proc.scratch / "init.safetensors"
            save_file({k: v.contiguous() for k, v in load_tensors(art, "init.safetensors").items()}, str(init))
        sources = {mod: (art.file(stored.file).read_text(), stored.original) for mod, stored in manifest.sources.items()}
        load = LoadModuleRequest(source=original_source(manifest.init.cls, sources, manifest.sys_path),
                                 init_args=list(manifest.init.args or []), init_kwargs=dict(manifest.init.kwargs or {}),
                                 init_tensors=str(init) if init else None, state=str(state),
                                 sys_path=[str(p) for p in proc.read_only[1:]], device=device)
        problem = load_reference(self, proc, "module", load, self.task.build_timeout)
        if problem:
            raise ReferenceFailed(f"the original module could not be loaded in its reference process: {problem}")
        try:
            request, _ = self.encode_call(args, kwargs, want, False, module_call, proc=proc)
            self.read_reply(proc.request(request, self.call_timeout), "the original module", proc)
        except Exception as e:  # noqa: BLE001 - a reference that cannot run leaves the speedup undetermined
            raise ReferenceFailed(f"the original module failed in its reference process: {e}") from None
        return TimedProcess(self, proc, "original module", device, feed, want, module_call, reference=True)

    def _verify_timed(self, reference: torch.nn.Module, training: bool, rng: dict | None):
        """The check of a timed batch's outputs: the original module on the inputs its last call saw."""
        def verify(outputs: list, args: list, kwargs: dict, label: str) -> str | None:
            want = tensors(self._reference(reference, args, kwargs, training, rng))
            if len(outputs) != len(want):
                return f"{len(outputs)} tensor(s) returned on {label}, {len(want)} expected"
            for i, (g, w) in enumerate(zip(outputs, want)):
                ok, detail = compare_output(g.detach().to(w.device), w.detach(), self.rtol, self.atol)
                if not ok:
                    self.check(f"output {i} values ({label})", False, detail)
                    return f"output {i} is wrong on {label}: {detail}"
            return None

        return verify


def original_source(class_path: str, sources: dict[str, tuple[str, str]], sys_path: list[str]) -> str:
    """A module candidate's source whose ``ModelNew`` is the captured class itself, found as replay
    finds it (script copies stored with the capture first, then ``sys_path``): the reference side
    of a module timing, loaded by the harness like any candidate."""
    return ("from modulelens.capture.sources import Resolver\n\n"
            f"ModelNew = Resolver({sources!r}, {sys_path!r})({class_path!r})\n")


def _reference_backward(module: torch.nn.Module, args: list, kwargs: dict, rng: dict) -> tuple[list, dict, list]:
    """The original module's input and parameter gradients for a random output gradient (also returned)."""
    from modulelens.capture.tracer import set_rng_states

    a = [x.detach().clone().requires_grad_(x.is_floating_point()) if isinstance(x, torch.Tensor) else x for x in args]
    module.train(True)
    module.zero_grad(set_to_none=True)
    set_rng_states(rng)
    with torch.enable_grad():
        outs = [o for o in tensors(module(*a, **dict(kwargs))) if o.requires_grad]
    gen = torch.Generator().manual_seed(0)
    grad_out = [torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.dtype) for o in outs]
    torch.autograd.backward(outs, [g.to(o.device, o.dtype) for g, o in zip(grad_out, outs)])
    params = {n: p.grad for n, p in module.named_parameters() if p.grad is not None}
    return [x.grad if isinstance(x, torch.Tensor) else None for x in a], params, grad_out


def _index(key: str) -> int:
    return int(key.rsplit(".", 1)[1])


def run_task(task: ValidateModuleTask, stage: Callable[[str], None]) -> ValidatedResult:
    """The sandbox worker's entry for ``validate_module`` tasks (``validate.run_task``'s counterpart):
    the report of the module candidate (see the module docstring). The candidate's code ran in its
    own candidate process; the capture's module was imported and built in the checker the worker
    forked for this task, never in the worker itself, which stays fit for reuse."""
    from modulelens.errors import ModuleLensError

    t0 = time.perf_counter()
    try:
        report = _ModuleValidator(task, stage).run()
    except ModuleLensError as e:
        report = ValidationReport(verdict="rejected", correct=False, reason=str(e), stage="setup", backend="module")
    report.seconds = time.perf_counter() - t0
    return ValidatedResult(report=report)
