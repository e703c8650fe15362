"""Validate a module-level candidate (``ModelNew``) against its capture. Runs inside a sandbox worker
(the checker); the candidate's code runs in its own contained candidate process.

The same checks as card candidates (:mod:`modulelens.validation.card`), on the whole module:
loads (its source runs, and may compile C++); is built with the captured constructor arguments and
takes the captured weights by name (``load_state_dict(strict=True)``); then, in eval mode without
grad, outputs on the captured inputs and on fresh inputs (seeds x normal, uniform, heavy-tailed,
special values) match the original module's, inputs are not mutated and no output shares the
inputs' memory (decided here from the arena: the checker inverts the input bytes and has the
candidate copy its outputs out again; an output that changed shares them, however it was mapped).
Then the steps of :mod:`modulelens.validation.module_checks`: the same with parameters drawn
afresh, training mode (with the same RNG state, and gradients) for a candidate that claims
training support; then the captured module's own edge cases
(:mod:`modulelens.validation.module_edge_cases`: fully masked rows and padded positions of an
attention mask, NaN and infinities in the other inputs, parameters at zero and negated scales, in
eval mode; the report's ``edge_cases`` lists them) and the sizes of a shape rule the candidate declares.

Tolerance: eager in the captured dtype is not exact either. When an output misses the per-dtype
tolerance, the original is run again in float64 (an oracle) and the candidate is accepted when its
error against the oracle is at most :data:`~modulelens.validation.compare.ORACLE_MULTIPLE` times
eager's own (both errors in the report's ``accuracy``): a candidate more accurate than eager passes.

Custom or wrapper: a candidate is a wrapper when its process ran computing aten operators
(profiler, a claim), mapped a foreign numerical library or crossed into numpy, or a library it
built imports vendor or past-the-dispatcher ATen symbols (``at::cpu::mul``, read with ``nm`` by the
checker from the file its memory map shows). With none of these, it is run once more where the
reference library is denied (:mod:`modulelens.validation.denial`): custom only when it stays
correct there. Partial fusion: a candidate may keep the library operators it declares
(``# modulelens-library-ops: aten.addmm, aten.bmm``: matrix products, convolutions, attention;
:mod:`modulelens.kernels.library_ops`); those are left usable in its denial run and every other
computing operator is denied, and its report names them (``library_ops``) and what eager computes
besides them, which it computes itself (``computes_itself``). An undeclared call is still a
wrapper, and so is a candidate of a module eager computes with only the declared operators.

Containment: like card candidates. The checker (this worker) holds the capture, the original
module, the reference outputs, the clock and the verdict; it writes the original's state dict and
the constructor's tensors into the candidate's scratch folder, and the candidate process
(:mod:`modulelens.validation.harness`: namespaces, private /tmp, rlimits, Landlock where the kernel
allows) builds ``ModelNew`` from them and is called through the shared arena. It may read only
system and Python folders, its scratch, the build cache and the capture's ``sys_path`` folders that
hold neither the repository nor the signing key (the constructor's argument classes import from
there): the report's ``isolation`` says what was in force, including whether the signing key and
the repository were out of reach.

Device: the task's ``device`` (``--device``), or the captured one when it is None: the original
module, its state and the inputs are loaded there in the checker, and the candidate and reference
processes build their modules there too; a device this machine lacks is a refusal
(:mod:`modulelens.device`), not a verdict. On another device than the captured one, training is
checked against the original module there (see :mod:`~modulelens.validation.module_checks`).
The timing note names the device.

Memory: comparisons stream over chunks and fresh inputs are drawn one case at a time; a capture too
big for the memory limit even so ends in a clear error naming the sizes and ``--memory-limit-mb``.

Timing: the original module runs in a reference process started and served exactly like the
candidate's (the same harness loads the captured class by its class path, built with the same
constructor arguments and the captured weights), and both are timed by this process's clock through
the same request in interleaved rounds (:mod:`modulelens.validation.timed`), in the mode the
candidate is packed for (training with grad for a training candidate, forward only, the same RNG
state set before every call on both sides; else eval without grad). Both sides hold the captured
state (the fresh-parameter checks load it back into the candidate before). The candidate's timed
outputs are checked on a random sample of batches, judged like the checks (float64 oracle in eval).
After a timing in training mode the captured state is loaded back into the original and the
candidate before the recheck, so it never compares running statistics the timing moved apart.

``ran``: set once a call's outputs came back to be compared, so a candidate rejected for its
outputs ran (only one that failed to load or build did not).
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

from modulelens.device import DeviceUnavailable, require, same_device
from modulelens.kernels import declared_library_ops
from modulelens.timing import thread_choice
from modulelens.validation.candidate_messages import Loaded, LoadModuleRequest
from modulelens.validation.checker import CandidateChecker, CandidateFailed, ModuleCall, start_candidate
from modulelens.validation.compare import compare_output, float64_args, judged_by_oracle, same_bits
from modulelens.validation.denial import DENIAL_EVIDENCE, check_by_denial, numpy_mode
from modulelens.validation.denial import verdict as denial_verdict
from modulelens.validation.evidence import FOREIGN_EVIDENCE, LIBRARY_EVIDENCE, NOT_SEEN, computing_ops
from modulelens.validation.inputs import fresh_inputs, tensors
from modulelens.validation.messages import (
    RefusedResult,
    SandboxResult,
    ValidatedResult,
    ValidateModuleTask,
    memory_refusal,
    out_of_memory,
)
from modulelens.validation.module_checks import ModuleChecks
from modulelens.validation.module_edge_cases import ModuleEdgeChecks
from modulelens.validation.report import Accuracy, ValidationReport
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
Oracle = Callable[[], list[torch.Tensor] | None]
Judge = Callable[[torch.Tensor, torch.Tensor, int, str], tuple[bool, Accuracy, str] | None]
"""(got, want, output index, why the tolerance failed) -> (accepted, accuracy entry, detail), or None."""


def readable_sys_path(sys_path: list[str], repo_root: Path) -> list[Path]:
    """The capture's ``sys_path`` folders a module candidate may read (its constructor's argument
    classes import from them): existing folders that are not the repository, the signing key's
    folder or the home folder, nor hold any of them."""
    from modulelens.repo import config_dir

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


# A candidate process that runs out of memory while the capture's inputs and outputs take at least
# 1/LIMIT_TOO_SMALL_SHARE of the limit is a refusal (raise the limit), not a rejection: the limit
# leaves too little room for the original's own data beside torch and the arena's copies.
LIMIT_TOO_SMALL_SHARE = 8


class _ModuleValidator(ModuleChecks, ModuleEdgeChecks, CandidateChecker):
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
        self.training_calls = 0  # training-mode calls made on both sides, each followed by a buffer check

    def run(self) -> ValidationReport:
        from modulelens.capture import KIND as CAPTURES
        from modulelens.capture import LoadedCapture, capture_manifest
        from modulelens.repo import Repository

        repo = Repository(self.task.repo)
        art = repo.open(CAPTURES, self.task.capture)
        manifest = capture_manifest(art)
        device = require(self.task.device or manifest.environment.device)
        self.captured_device = manifest.environment.device
        self.on_captured_device = same_device(device, self.captured_device)
        loaded = LoadedCapture(art, device=device)  # the module, its state and inputs moved to ``device``
        conf = self.task.confinement  # the caller's list: it knows where the key and the home folder are
        folders = [Path(p) for p in conf.readable] if conf else readable_sys_path(manifest.sys_path, repo.root)
        read_only = [Path(self.task.build_dir), *folders]
        self.threads = thread_choice()
        self.proc = start_candidate(self.task.memory_limit_mb, read_only=read_only)
        self.reference_proc = None  # the original module's own process, started when checks begin
        try:
            return self._run(art, manifest, loaded, device)
        except CandidateFailed as e:
            reason = str(e)
            data = getattr(self, "data_bytes", 0)
            if "memory" in reason and data * LIMIT_TOO_SMALL_SHARE >= self.task.memory_limit_mb * 2**20:
                # The capture's own data takes so much of the limit that the original would not fit either:
                # a refusal naming the limit, not a verdict on the candidate.
                raise MemoryError(reason) from e
            if "memory" in reason and data:
                reason += (f"; the capture's inputs and outputs alone take {data / 2**20:.0f} MiB of the "
                           f"{self.task.memory_limit_mb} MB limit: if the candidate needs no more than the original, "
                           "raise it with --memory-limit-mb")
            return self.reject(reason)
        finally:
            self.report.stdout_bytes = self.proc.stdout_bytes()
            self.proc.remove()
            if self.reference_proc is not None:
                self.reference_proc.remove()

    def _module_request(self, proc: Any, art: Any, manifest: Any, state: dict[str, torch.Tensor], device: str,
                        source: str, class_name: str = "ModelNew",
                        shared_build_dir: str | None = None) -> LoadModuleRequest:
        """Write ``state`` and the constructor's tensors into ``proc``'s scratch folder; the request
        that has that process build ``class_name`` of ``source`` from them."""
        from safetensors.torch import save_file

        from modulelens.capture import load_tensors

        path = proc.scratch / "state.safetensors"
        save_file({k: v.detach().cpu().contiguous().clone() for k, v in state.items()}, str(path))
        init = None
        if art.has_file("init.safetensors"):
            init = proc.scratch / "init.safetensors"
            save_file({k: v.contiguous() for k, v in load_tensors(art, "init.safetensors").items()}, str(init))
        return LoadModuleRequest(source=source, class_name=class_name, init_args=list(manifest.init.args or []),
                                 init_kwargs=dict(manifest.init.kwargs or {}), init_tensors=str(init) if init else None,
                                 state=str(path), sys_path=[str(p) for p in proc.read_only[1:]], device=device,
                                 shared_build_dir=shared_build_dir)

    def _load(self, checker: CandidateChecker, art: Any, manifest: Any, reference: torch.nn.Module,
              device: str) -> Loaded:
        """Write the weights and the constructor's tensors into ``checker``'s candidate's scratch
        folder and have that candidate process load and build ``ModelNew`` from them."""
        if checker is self:
            self.get_ready("module")
        req = self._module_request(checker.proc, art, manifest, reference.state_dict(), device,
                                   self.task.candidate.source, self.task.candidate.class_name, self.task.build_dir)
        loaded = checker._request(req, timeout=self.task.build_timeout)
        if loaded.ok and checker is self:  # a denial run takes the builds this run verified and shared
            self.publish_extensions(loaded, self.task.candidate.source, Path(self.task.build_dir))
        return loaded

    def _run(self, art: Any, manifest: Any, loaded: Any, device: str) -> ValidationReport:
        cand = self.task.candidate
        if "source" not in manifest.strategies or manifest.init is None:
            return self.reject(f"capture {art.ref} has no constructor arguments: ModelNew cannot be built like the module")
        reference = loaded.build("source")
        self.stage("compile")
        result = self._load(self, art, manifest, reference, device)
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
        self.data_bytes = sum(t.numel() * t.element_size() for t in tensors([args, kwargs, expected]))
        self.captured_state = {k: v.detach().clone() for k, v in reference.state_dict().items()}
        claims = cand.claims_training and manifest.training
        self.stage("check")
        for label, a, k in self.input_cases(args, kwargs):
            problem = self.check_case(reference, a, k, f"eval, {label}", training=False, rng=None)
            if problem:
                return self.reject(problem)
        note = EVAL_ONLY if not claims else SAME_RNG
        if claims:
            problem = self.check_training(loaded, reference, args, kwargs, expected)
            if problem:
                return self.reject(problem)
        problem = self.check_fresh_state(reference, args, kwargs)
        if problem:
            return self.reject(problem)
        problem = self.check_edge_cases(reference, args, kwargs, self.task.seeds[0] if self.task.seeds else 0)
        if problem:
            return self.reject(problem)
        problem = self.check_shape_rule(reference, args, kwargs, claims)
        if problem:
            return self.reject(problem)
        self.report.ran, self.report.correct = True, True
        if self.task.time:
            self.stage("time")
            self.time_it(reference, args, kwargs, claims, device, art, manifest)
            self.stage("recheck")
            if claims:  # timed training calls moved each side's running statistics a different number of times
                problem = self.restore_captured_state(reference)
                if problem:
                    self.report.correct = False
                    return self.reject(problem)
            a, k = fresh_inputs(args, kwargs, 9973, "normal")
            problem = self.check_case(reference, a, k, "fresh values in the timed buffers after timing",
                                      training=False, rng=None)
            if problem:
                self.report.correct = False
                return self.reject(problem)
        else:
            self.report.timing_note = f"ran {self._where(device)}"
        self.report.stage = "done"
        self.report.timing_note = (self.report.timing_note + "; " if self.report.timing_note else "") + note
        return self._decide(note, lambda checker: self._load(checker, art, manifest, reference, device),
                            reference, args, kwargs)

    def _where(self, device: str) -> str:
        """Where the module ran, for the timing note: the device, and whether it is the captured one."""
        return f"on {device}" + (" (the captured device)" if self.on_captured_device
                                 else f" (captured on {self.captured_device})")

    # -- the verdict ------------------------------------------------------------------------------
    def _decide(self, note: str, load: Callable[[CandidateChecker], Loaded], reference: torch.nn.Module,
                args: list, kwargs: dict) -> ValidationReport:
        foreign = self.foreign_evidence()
        symbols = self.built_symbols()
        self.report.backend_calls = sorted(self.ops) + symbols + foreign
        self.report.wrapper_evidence = "; ".join([
            "aten ops recorded by the profiler in the candidate's process during its forward calls, all threads "
            "(reported by that process)", LIBRARY_EVIDENCE, FOREIGN_EVIDENCE, DENIAL_EVIDENCE, NOT_SEEN])
        if foreign:
            self.report.verdict = "wrapper"
            self.report.reason = f"correct, but it computes with a foreign library: {'; '.join(foreign)}; {note}"
            return self.report
        if symbols:
            self.report.verdict = "wrapper"
            self.report.reason = ("correct, but a library it built calls into " + ", ".join(symbols[:5])
                                  + f"; {note}; {CONTAINED}")
            return self.report
        declared = declared_library_ops(self.task.candidate.source)
        refused = ("; declared but not kept: " + "; ".join(declared.refused)) if declared.refused else ""
        undeclared = sorted(op for op in self.ops if not declared.keeps(op))
        if undeclared:
            self.report.verdict = "wrapper"
            self.report.reason = ("correct, and computes through " + ", ".join(undeclared[:5])
                                  + (" ..." if len(undeclared) > 5 else "")
                                  + (" (not declared in `# modulelens-library-ops:`)" if declared.kept else "")
                                  + f"{refused}; {note}; {CONTAINED}")
            return self.report
        if declared.kept:
            self.report.library_ops = list(declared.kept)
            self.report.computes_itself = [op for op in eager_computing_ops(reference, args, kwargs)
                                           if not declared.keeps(op)]
            if not self.report.computes_itself:
                self.report.verdict = "wrapper"
                self.report.reason = ("correct, but it computes nothing itself: eager computes this module with only "
                                      "the library operators it keeps (" + ", ".join(declared.kept) + f"){refused}; "
                                      f"{note}; {CONTAINED}")
                return self.report
        self.stage("denial")
        cases = [("captured inputs", args, kwargs)]
        if self.task.seeds:
            a, k = fresh_inputs(args, kwargs, self.task.seeds[0], "normal")
            cases.append((f"normal inputs, seed {self.task.seeds[0]}", a, k))
        calls = [(f"denial, {label}", a, k, tensors(self.run_original(reference, a, k, False, None)), ModuleCall(False))
                 for label, a, k in cases]
        inputs = {label: (a, k) for label, a, k, _, _ in calls}

        def compare(got: list[torch.Tensor], want: list[torch.Tensor], label: str) -> str | None:
            a, k = inputs[label]
            return self.values_problem(got, want, label, oracle=lambda: self._oracle(reference, a, k))

        denial, more = check_by_denial(
            backend="module", memory_limit_mb=self.task.memory_limit_mb, read_only=self.proc.read_only,
            call_timeout=self.call_timeout, numpy=numpy_mode("module"), load=load,
            cases=calls, compare=compare, keep=tuple(declared.bases))
        self.report.denial = denial
        self.check("correct where the reference library is denied", denial.outcome == "computes itself",
                   denial.detail)
        if more:
            self.report.backend_calls += more
            self.report.verdict = "wrapper"
            self.report.reason = ("correct, but a library it loaded where the reference library is denied calls into "
                                  + ", ".join(more[:5]) + f"; {note}; {CONTAINED}")
            return self.report
        self.report.verdict, reason = denial_verdict(denial)
        if declared.kept and self.report.verdict == "custom":
            reason = ("correct, and still correct where every computing operator but the library operators it keeps ("
                      + ", ".join(declared.kept) + ") is denied: it computes itself what eager computes with "
                      + ", ".join(self.report.computes_itself[:8])
                      + (" ..." if len(self.report.computes_itself) > 8 else "") + refused)
        self.report.reason = f"{reason}; {note}; {CONTAINED}"
        self.report.stage = "done"
        return self.report

    # -- one call -----------------------------------------------------------------------------
    def run_original(self, reference: torch.nn.Module, args: list, kwargs: dict, training: bool,
                     rng: dict | None) -> Any:
        """The original module's outputs on copies of ``args`` (``rng``: the RNG state set before)."""
        from modulelens.capture import set_rng_states

        reference.train(training)
        if rng is not None:
            set_rng_states(rng)
        with torch.set_grad_enabled(training):
            return reference(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args], **dict(kwargs))

    def _oracle(self, reference: torch.nn.Module, args: list, kwargs: dict) -> list[torch.Tensor] | None:
        """The original's eval outputs in float64 (a copy of it and of the inputs in float64), or
        None when it cannot run so, returns no float64 output, or would not fit the memory limit."""
        weights = sum(t.numel() * t.element_size() for t in reference.state_dict().values())
        if 2 * weights > self.task.memory_limit_mb * 2**20 // 4:
            return None
        try:
            oracle = copy.deepcopy(reference).to(torch.float64).eval()
            with torch.no_grad():
                out = tensors(oracle(*float64_args(list(args)),
                                     **dict(zip(kwargs, float64_args(list(kwargs.values()))))))
        except Exception:  # noqa: BLE001 - a module that cannot run in float64 has no oracle
            return None
        if any(o.is_floating_point() and o.dtype != torch.float64 for o in out):
            return None
        return out

    def values_problem(self, got: list[torch.Tensor], want: list[torch.Tensor], label: str,
                       rtol: float | None = None, oracle: Oracle | None = None, quiet: bool = False,
                       judge: Judge | None = None) -> str | None:
        """Why ``got`` does not stand for ``want`` on ``label``, or None; checks recorded (``quiet``:
        only a failure, for the checks of timed batches). An output outside the tolerance is judged
        against the float64 ``oracle`` when there is one, or by ``judge`` (gradients: see
        :meth:`~modulelens.validation.module_checks.ModuleChecks.gradient_judge`)."""
        g, w = tensors(got), tensors(want)
        if len(g) != len(w) or not quiet:
            self.check(f"output structure ({label})", len(g) == len(w), f"{len(g)} tensors, {len(w)} expected")
        if len(g) != len(w):
            return f"returns {len(g)} tensor(s) where the module returns {len(w)} ({label})"
        reference64: list[torch.Tensor] | None = None
        for i, (x, y) in enumerate(zip(g, w)):
            x = x.detach().to(y.device)
            ok, detail = compare_output(x, y.detach(), rtol if rtol is not None else self.rtol, self.atol)
            comparable = x.shape == y.shape and x.dtype == y.dtype and y.is_floating_point()
            if not ok and oracle is not None and comparable:
                reference64 = reference64 if reference64 is not None else (oracle() or [])
                if i < len(reference64) and reference64[i].shape == y.shape:
                    ok, entry, detail = judged_by_oracle(x, y.detach(), reference64[i], label, i, detail)
                    if not (quiet and ok):
                        self.report.accuracy.append(entry)
            elif not ok and judge is not None and comparable:
                judged = judge(x, y.detach(), i, detail)
                if judged is not None:
                    ok, entry, detail = judged
                    if not (quiet and ok):
                        self.report.accuracy.append(entry)
            if quiet and ok:
                continue
            if not self.check(f"output {i} values ({label})", ok, detail):
                return f"output {i} is wrong on {label}: {detail}"
        return None

    def check_case(self, reference: torch.nn.Module, args: list, kwargs: dict, label: str, training: bool,
                   rng: dict | None) -> str | None:
        want = tensors(self.run_original(reference, args, kwargs, training, rng))
        result = self.call(args, kwargs, want, trace=True, label=label, module_call=ModuleCall(training, rng))
        self.report.ran = True  # its outputs are compared below, whatever they turn out to be
        self.ops.update(computing_ops(result.ops or []))
        for i, (slot, before) in enumerate(result.inputs):
            if not same_bits(self.proc.arena.read(slot), before):
                self.check(f"inputs unchanged ({label})", False, f"input {i} modified")
                return f"mutates input {i} ({label})"
        shared = self.outputs_sharing_inputs(result)
        if shared:
            self.check(f"no aliasing ({label})", False, f"output {shared[0]} changed when the checker rewrote the inputs")
            return (f"output {shared[0]} shares memory with the inputs: it changed when the checker rewrote them "
                    f"after the call ({label})")
        oracle = None if training else (lambda: self._oracle(reference, args, kwargs))
        problem = self.values_problem(result.outputs, want, label, oracle=oracle)
        if problem is None and training:
            problem = self.buffers_problem(reference, label)
        return problem

    def time_it(self, reference: torch.nn.Module, args: list, kwargs: dict, training: bool, device: str,
                art: Any, manifest: Any) -> None:
        """The original module (in its own reference process) against the candidate, in the mode
        the candidate is packed for (see the module docstring)."""
        from modulelens.capture import rng_states

        rng = rng_states() if training else None  # set before every timed call, on both sides
        module_call = ModuleCall(training, rng)
        want = tensors(self.run_original(reference, args, kwargs, training, rng))
        self.call(args, kwargs, want, trace=False, label="timing inputs", module_call=module_call)
        mode = "training mode with grad (forward)" if training else "eval mode without grad"
        what = f"module forward {self._where(device)}, in {mode} (fresh values per round)"
        feed = TimingFeed(args, kwargs)
        cand = TimedProcess(self, self.proc, "candidate", device, feed, want, module_call,
                            verify=self._verify_timed(reference, training, rng))
        plan = timing_plan(self.task.min_run_time, self.task.timing_budget_s, self.task.target_width)
        original = partial(self._original_side, art, manifest, device, feed, want, args, kwargs, module_call)
        time_against(self, original, cand, plan, what, "original")
        if self.report.speedup_vs_eager is not None and self.report.speedup_vs_eager > 10:
            self.report.flags.append(f"suspicious: {self.report.speedup_vs_eager:.1f}x faster than eager")

    def _original_side(self, art: Any, manifest: Any, device: str, feed: TimingFeed, want: list, args: list,
                       kwargs: dict, module_call: ModuleCall) -> TimedProcess:
        """The reference process with the original module loaded (its captured class found as
        replay finds it, built with the captured constructor arguments and the captured state, never
        a fresh draw) and called once."""
        proc = self.reference_proc
        if proc is None:
            raise ReferenceFailed("no reference process")
        sources = {mod: (art.file(stored.file).read_text(), stored.original) for mod, stored in manifest.sources.items()}
        load = self._module_request(proc, art, manifest, self.captured_state, device,
                                    original_source(manifest.init.cls, sources, manifest.sys_path))
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
        """The check of a timed batch's outputs: the original module on the inputs its last call saw,
        judged like the checks (the float64 oracle in eval mode)."""
        def verify(outputs: list, args: list, kwargs: dict, label: str) -> str | None:
            want = tensors(self.run_original(reference, args, kwargs, training, rng))
            oracle = None if training else (lambda: self._oracle(reference, args, kwargs))
            return self.values_problem(outputs, want, label, oracle=oracle, quiet=True)

        return verify


def eager_computing_ops(module: torch.nn.Module, args: list, kwargs: dict) -> list[str]:
    """The computing aten operators (``aten::NAME``, sorted) eager runs for ``module`` in eval mode
    without grad on copies of ``args``: what a partially fusing candidate must compute itself
    besides the library operators it keeps. Recorded below the autograd and composite layers (a
    dispatch mode), so ``linear`` shows as the ``addmm`` it runs."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: set[str] = set()

    class _Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, a=(), k=None):
            seen.add(func._schema.name)
            return func(*a, **(k or {}))

    module.eval()
    with torch.no_grad(), _Record():
        module(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args], **dict(kwargs))
    return sorted(computing_ops(sorted(seen)))


def original_source(class_path: str, sources: dict[str, tuple[str, str]], sys_path: list[str]) -> str:
    """A module candidate's source whose ``ModelNew`` is the captured class itself, found as replay
    finds it (script copies stored with the capture first, then ``sys_path``): the reference side
    of a module timing, loaded by the harness like any candidate."""
    return ("from modulelens.capture.sources import Resolver\n\n"
            f"ModelNew = Resolver({sources!r}, {sys_path!r})({class_path!r})\n")


def run_task(task: ValidateModuleTask, stage: Callable[[str], None]) -> SandboxResult:
    """The sandbox worker's entry for ``validate_module`` tasks (``validate.run_task``'s counterpart):
    the report of the module candidate (see the module docstring). The candidate's code ran in its
    own candidate process; the capture's module was imported and built in the checker the worker
    forked for this task, never in the worker itself, which stays fit for reuse. Running out of
    memory is a refusal naming the limit, not a verdict."""
    from modulelens.errors import ModuleLensError

    t0 = time.perf_counter()
    validator = _ModuleValidator(task, stage)
    try:
        report = validator.run()
    except DeviceUnavailable as e:  # a refusal (nothing was validated), not a verdict on the candidate
        return RefusedResult(message=e.message, hint=e.hint, healthy=True)
    except ModuleLensError as e:
        report = ValidationReport(verdict="rejected", correct=False, reason=str(e), stage="setup", backend="module")
    except (MemoryError, RuntimeError, OSError) as e:
        if not out_of_memory(e):
            raise
        return memory_refusal(task, f"a candidate of capture {task.capture}", getattr(validator, "data_bytes", None))
    report.seconds = time.perf_counter() - t0
    return ValidatedResult(report=report)
