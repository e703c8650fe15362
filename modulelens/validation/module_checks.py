"""The module checker's steps beyond eval on the captured and fresh inputs
(:mod:`modulelens.validation.module`): parameters drawn afresh, training mode and a declared shape
rule. :class:`ModuleChecks` is mixed into that checker; each step records its checks in the report
and returns why the candidate fails, or None.

Fresh parameters: a pack shares the live model's weights, which training moves away from the
captured ones, so beside the captured state every candidate is checked with parameters and
floating buffers drawn afresh (one draw per seed, see :data:`~modulelens.validation.inputs.FRESH_STATE`),
loaded into both the original and the candidate, on the captured inputs and on fresh ones. The
report lists what was varied (``varied``) and a rejection names the draw that exposed it.

Training mode (only for a candidate that claims training support, and a capture made in
training mode): dropout is checked **with the same RNG state**: the CPU/CUDA generators are set
to the same state before the original and the candidate run, so a candidate that draws its
dropout masks like eager (same operators, same order) gets the same masks. On the captured
inputs the output must also match the captured output (the capture stored the RNG state before
the call). Gradients: with captured gradients (``--backward``), the candidate's parameter and
input gradients for the captured output gradient must match the captured ones; without, they
must match the original module's for a random output gradient. A candidate that does not claim
training support is checked in eval mode only, and the verdict says so. On another device than the
captured one, random draws and rounding are that device's own, so the captured RNG state, output
and gradients are no reference there: training is checked against the original module on that
device, with an RNG state drawn there (the report's checks say so).

Buffers are outputs of a training call: every training-mode call is made on both sides (the same
inputs, mode and RNG state, so both sides' state moves alike), and after each the original's
buffers (running statistics, counters such as ``num_batches_tracked``) are compared with the
candidate's of the same name, read out of its process; a mismatch names the buffer and the call
("bn.running_mean differs after training call 1 (...)"). After the training calls, eval on the
captured inputs checks what those statistics do. The candidate's buffers are its claim; the eval
outputs are not.

Gradients outside the tolerance are judged against a float64 oracle (the original run in float64
from the buffers its call started from, same RNG state and output gradient). One whose float64
value is within :func:`gradient_floor` (an absolute floor from the scale of that backward: a bias
in front of a training-mode BatchNorm has a mathematically zero gradient, rounding noise on both
sides) passes when the candidate's max abs error is within that floor; others like outputs, within
:data:`~modulelens.validation.compare.ORACLE_MULTIPLE` times eager's error. Both errors go in the
report's ``accuracy`` (with the floor where it applied).

State between steps: the fresh-parameter checks and, after a timing in training mode (whose timed
calls move the running statistics a different number of times on each side), the recheck start
from the captured state loaded back into both (:meth:`ModuleChecks.restore_captured_state`).

Shape rule: a candidate may declare the dimensions of ``forward``'s inputs it takes at other sizes
(``# modulelens-variable-dims: 0.0 0.1`` in its source, positions counting ``forward``'s arguments
then its keyword arguments, see :mod:`modulelens.kernels.shape_rules`). After the checks above it
is checked on fresh inputs at sizes that were not captured (:func:`~modulelens.validation.shape_rules.shape_rule_cases`),
eval like the others and, for a candidate that claims training support, training forward and
gradients against the original module's; the report's ``shape_rule`` records it as checked, and
a pack entry admits calls by it.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from typing import Any

import torch

from modulelens.kernels import declared_rule
from modulelens.validation.checker import ModuleCall
from modulelens.validation.compare import (
    ORACLE_MULTIPLE,
    compare_output,
    float64_args,
    judged_by_oracle,
    lower_precision,
    oracle_errors,
)
from modulelens.validation.inputs import FRESH_STATE, fresh_inputs, fresh_state, tensors
from modulelens.validation.messages import ValidateModuleTask
from modulelens.validation.report import Accuracy, ValidationReport, finite_or_none
from modulelens.validation.shape_rules import checked_rule, rule_problem, shape_rule_cases


class ModuleChecks:
    """The steps of the module checker kept here (see the module docstring). The checker provides
    what they use: its task and report, the captured state and device, the count of training calls,
    ``check``, ``call``, ``load_state`` and ``read_buffers``
    (:class:`~modulelens.validation.checker.CandidateChecker`), and its own
    ``run_original``, ``check_case`` and ``values_problem``."""

    task: ValidateModuleTask
    report: ValidationReport
    rtol: float | None
    captured_state: dict[str, torch.Tensor]
    captured_device: str
    on_captured_device: bool
    training_calls: int
    check: Any
    call: Any
    load_state: Any
    read_buffers: Any
    run_original: Any
    check_case: Any
    values_problem: Any

    def input_cases(self, args: list, kwargs: dict) -> Iterator[tuple[str, list, dict]]:
        """The captured inputs, then fresh inputs per seed and distribution, drawn one at a time."""
        yield "captured inputs", args, kwargs
        for seed in self.task.seeds:
            for dist in self.task.distributions:
                a, k = fresh_inputs(args, kwargs, seed, dist)
                yield f"{dist} inputs, seed {seed}", a, k

    # -- shape rule -------------------------------------------------------------------------------
    def check_shape_rule(self, reference: torch.nn.Module, args: list, kwargs: dict, training: bool) -> str | None:
        """The variable dimensions the candidate declares (:mod:`modulelens.kernels.shape_rules`,
        positions counting ``forward``'s arguments then its keyword arguments), checked on fresh
        inputs at sizes that were not captured: eval like the captured checks, and for a candidate
        that claims training support also training forward (same RNG state) and its gradients
        against the original module's. Sets the report's ``shape_rule`` once every case passed."""
        rule = declared_rule(self.task.candidate.source)
        if rule is None:
            return None
        problem = rule_problem(rule, args, kwargs)
        if problem:
            return f"its declared shape rule ({rule.text()}) does not fit the module's call: {problem}"
        for label, a, k in shape_rule_cases(rule, args, kwargs):
            problem = self.check_case(reference, a, k, f"eval, {label}", training=False, rng=None)
            if problem is None and training:
                problem = self.check_training_case(reference, a, k, label)
            if problem:
                return problem
        self.report.shape_rule = checked_rule(rule, args, kwargs)
        return None

    def check_training_case(self, reference: torch.nn.Module, args: list, kwargs: dict, label: str) -> str | None:
        """Training forward with the same RNG state on both sides, then the gradients for a random
        output gradient against the original module's."""
        from modulelens.capture import rng_states

        rng = rng_states()
        problem = self.check_case(reference, args, kwargs, f"training, same RNG state, {label}", training=True, rng=rng)
        if problem:
            return problem
        return self.gradients_against_original(reference, args, kwargs, rng,
                                               f"gradients against the original module, {label}")

    # -- fresh parameters -------------------------------------------------------------------------
    def check_fresh_state(self, reference: torch.nn.Module, args: list, kwargs: dict) -> str | None:
        """The eval checks again with parameters and floating buffers drawn afresh (one draw per
        seed), loaded into both the original and the candidate, on the captured inputs and on
        normal fresh ones; the captured state is loaded back into both afterwards."""
        parameters = {n for n, _ in reference.named_parameters()}
        with torch.no_grad():
            base = [o.detach() for o in tensors(self.run_original(reference, args, kwargs, False, None))]
        for seed in self.task.seeds:
            state, varied, kept = fresh_state(self.captured_state, parameters, 7919 + seed)
            if not varied:
                break
            self.report.varied = sorted(set(self.report.varied) | set(varied))
            self.report.varied_how = FRESH_STATE + (f"; kept: {', '.join(kept[:10])}" if kept else "")
            draw = f"fresh parameters, seed {seed} ({', '.join(varied[:6])}{' ...' if len(varied) > 6 else ''} drawn afresh)"
            reference.load_state_dict(state)
            error = self.load_state(state)
            if not self.check(f"takes other parameters ({draw})", not error, error):
                return f"cannot take other parameters of the same shapes ({error})"
            fresh_a, fresh_k = fresh_inputs(args, kwargs, seed, "normal")
            for label, a, k in (("captured inputs", args, kwargs), (f"normal inputs, seed {seed}", fresh_a, fresh_k)):
                with torch.no_grad():
                    want = tensors(self.run_original(reference, a, k, False, None))
                if _newly_non_finite(want, base):
                    self.check(f"eval, {draw}, {label}", True, "skipped: the original is not finite with these values")
                    continue
                problem = self.check_case(reference, a, k, f"eval, {draw}, {label}", training=False, rng=None)
                if problem:
                    return problem
        return self.restore_captured_state(reference)

    def restore_captured_state(self, reference: torch.nn.Module) -> str | None:
        """The captured parameters and buffers loaded back into the original and the candidate, so
        that what comes next compares two modules of the same state; why the candidate cannot take
        them, or None."""
        reference.load_state_dict(self.captured_state)
        error = self.load_state(self.captured_state)
        return f"cannot take the captured parameters back ({error})" if error else None

    # -- training ---------------------------------------------------------------------------------
    def check_training(self, loaded: Any, reference: torch.nn.Module, args: list, kwargs: dict,
                       expected: Any) -> str | None:
        """Training forward on the captured and fresh inputs (same RNG state on both sides), against
        the captured output, the gradients, then eval on the captured inputs with the running
        statistics those training calls left (every training call is made on both sides, and the
        buffers are compared after each, see :meth:`buffers_problem`)."""
        from modulelens.capture import rng_states

        # random draws (dropout) follow each device's own generator: on another device than the
        # captured one, the captured RNG state, output and gradients are no reference
        captured_rng = loaded.rng() if self.on_captured_device else rng_states()
        for label, a, k in self.input_cases(args, kwargs):
            rng = captured_rng if label == "captured inputs" else rng_states()
            problem = self.check_case(reference, a, k, f"training, same RNG state, {label}", training=True, rng=rng)
            if problem:
                return problem
        label = "training, captured RNG state, against the captured output"
        if self.on_captured_device:
            got = self.call(args, kwargs, tensors(expected), trace=False, label="training, captured RNG state",
                            module_call=ModuleCall(True, captured_rng))
            self.run_original(reference, args, kwargs, True, captured_rng)  # the same call on the original's state
            problem = self.values_problem(got.outputs, expected, label) or self.buffers_problem(reference, label)
            if problem:
                return problem
        else:
            self.check(label, True, f"skipped: captured on {self.captured_device} (random draws and rounding differ "
                       "by device); checked against the original module on this device instead")
        problem = self.check_gradients(loaded, reference, args, kwargs, captured_rng)
        if problem:
            return problem
        return self.check_case(reference, args, kwargs, f"eval after {self.training_calls} training calls, "
                               "captured inputs", training=False, rng=None)

    def buffers_problem(self, reference: torch.nn.Module, label: str) -> str | None:
        """After a training call made on both sides (``label``): every buffer of the original's state
        dict (running statistics, counters such as ``num_batches_tracked``) against the candidate's
        of the same name, read out of its process; a mismatch names the buffer and the call. A
        training call's buffers are outputs of it like its return value."""
        self.training_calls += 1
        names = {n for n, _ in reference.named_buffers()}
        want = {n: t.detach() for n, t in reference.state_dict().items() if n in names}
        if not want:
            return None
        where = f"after training call {self.training_calls} ({label})"
        got, missing = self.read_buffers(want)
        for name, w in want.items():
            if name in missing or name not in got:
                self.check(f"buffer {name} {where}", False, "not in its state dict")
                return f"{name} is not in its state dict {where}"
            ok, detail = compare_output(got[name].to(w.device), w, self.rtol, self.atol)
            if not ok:
                self.check(f"buffer {name} {where}", False, detail)
                return f"{name} differs {where}: {detail}"
        self.check(f"buffers {where}", True, ", ".join(want))
        return None

    def check_gradients(self, loaded: Any, reference: torch.nn.Module, args: list, kwargs: dict,
                        rng: dict) -> str | None:
        captured = self.on_captured_device and loaded.artifact.has_file("grads.safetensors")
        grads = loaded.grads() if captured else {}
        captured_out = [grads[k] for k in sorted((k for k in grads if k.startswith("grad_output.")), key=_index)]
        if not captured_out:
            why = "no captured gradients" if self.on_captured_device else f"captured on {self.captured_device}"
            return self.gradients_against_original(reference, args, kwargs, rng,
                                                   f"gradients, against the original module ({why})")
        before = _buffers(reference)
        want = tensors(self.run_original(reference, args, kwargs, True, rng))  # the candidate's call, on the original
        want_params = {k.removeprefix("param."): v for k, v in grads.items() if k.startswith("param.")}
        want_inputs = {int(k.split(".")[1]): v for k, v in grads.items() if k.startswith("grad_input.")}
        backward = _Backward(reference, before, args, kwargs, rng, captured_out, self.oracle_room())
        return self.compare_gradients(backward, "gradients, against the captured gradients", want, want_params,
                                      want_inputs)

    def gradients_against_original(self, reference: torch.nn.Module, args: list, kwargs: dict, rng: dict,
                                   label: str) -> str | None:
        """The candidate's gradients for a random output gradient against the original module's
        (its forward, with ``rng`` set, is the one the candidate's call is paired with)."""
        before = _buffers(reference)
        want, ref_inputs, want_params, grad_out = _reference_backward(reference, args, kwargs, rng)
        backward = _Backward(reference, before, args, kwargs, rng, grad_out, self.oracle_room())
        return self.compare_gradients(backward, label, want, want_params,
                                      {i: g for i, g in enumerate(ref_inputs) if g is not None})

    def compare_gradients(self, backward: _Backward, label: str, want: list[torch.Tensor],
                          want_params: dict[str, torch.Tensor], want_inputs: dict[int, torch.Tensor]) -> str | None:
        """The candidate's parameter and input gradients for ``backward``'s output gradient against
        the wanted ones (``want``: the original's outputs of the same call, which size the room for
        the candidate's), each judged by :meth:`gradient_judge` where the tolerance is not met; then
        the buffers that training call left."""
        reference, args = backward.module, backward.args
        room = sum(p.numel() * p.element_size() + 64 for p in reference.parameters())
        room += sum(a.numel() * a.element_size() + 64 for a in args if isinstance(a, torch.Tensor))
        got = self.call(args, backward.kwargs, want, trace=False, label=label,
                        module_call=ModuleCall(True, backward.rng, [g.detach() for g in backward.grad_outputs],
                                               grad_room=room))
        self.report.ran = True
        inputs, params = got.input_grads, got.param_grads
        for name, w in want_params.items():
            if name not in params:
                self.check(f"{label}: {name}", False, "no gradient")
                return f"parameter {name} gets no gradient ({label})"
            problem = self.values_problem([params[name]], [w], f"{label}: {name}", rtol=self.rtol or 1e-4,
                                          judge=self.gradient_judge(backward, name, f"{label}: {name}"))
            if problem:
                return problem
        for i, w in want_inputs.items():
            if i < len(inputs) and inputs[i] is not None:
                problem = self.values_problem([inputs[i]], [w], f"{label}: input {i}", rtol=self.rtol or 1e-4,
                                              judge=self.gradient_judge(backward, i, f"{label}: input {i}"))
                if problem:
                    return problem
        return self.buffers_problem(reference, label)

    def oracle_room(self) -> int:
        """Bytes a float64 copy of the original may take (a quarter of the memory limit)."""
        return self.task.memory_limit_mb * 2**20 // 4

    def gradient_judge(self, backward: _Backward, key: str | int, case: str) -> Any:
        """How a gradient outside the tolerance is judged against the float64 oracle (``key``: a
        parameter's name or an input's position): at rounding-noise scale (its float64 value within
        :func:`gradient_floor`; a bias in front of a training-mode BatchNorm, whose gradient is
        mathematically zero) the candidate's max abs error must be within that floor (or within
        :data:`~modulelens.validation.compare.ORACLE_MULTIPLE` times eager's, if larger), else like
        outputs (:func:`~modulelens.validation.compare.judged_by_oracle`); both errors reported."""
        def judge(got: torch.Tensor, want: torch.Tensor, output: int, why: str) -> Any:
            oracle = backward.oracle()
            if oracle is None or key not in oracle.grads or oracle.grads[key].shape != want.shape:
                return None
            reference64 = oracle.grads[key]
            floor = gradient_floor(want.dtype, oracle.scale, backward.reduced(want))
            if float(reference64.abs().max()) > floor:
                return judged_by_oracle(got, want, reference64, case, output, why)
            return judged_by_floor(got, want, reference64, floor, case, output, why)

        return judge
def _newly_non_finite(outputs: list[torch.Tensor], base: list[torch.Tensor]) -> bool:
    """Some floating output is not finite where the original with the captured state was."""
    for o, b in zip(outputs, base):
        if o.is_floating_point() and b.shape == o.shape and bool(torch.isfinite(b).all()) and not bool(
                torch.isfinite(o).all()):
            return True
    return False


def _reference_backward(module: torch.nn.Module, args: list, kwargs: dict, rng: dict) -> tuple[list, list, dict, list]:
    """The original module's outputs, input and parameter gradients for a random output gradient
    (also returned)."""
    from modulelens.capture import set_rng_states

    a = [x.detach().clone().requires_grad_(x.is_floating_point()) if isinstance(x, torch.Tensor) else x for x in args]
    module.train(True)
    module.zero_grad(set_to_none=True)
    set_rng_states(rng)
    with torch.enable_grad():
        every = tensors(module(*a, **dict(kwargs)))
    outs = [o for o in every if o.requires_grad]
    gen = torch.Generator().manual_seed(0)
    grad_out = [torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.dtype) for o in outs]
    torch.autograd.backward(outs, [g.to(o.device, o.dtype) for g, o in zip(grad_out, outs)])
    params = {n: p.grad for n, p in module.named_parameters() if p.grad is not None}
    return ([o.detach() for o in every], [x.grad if isinstance(x, torch.Tensor) else None for x in a], params,
            grad_out)


def _buffers(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Copies of ``module``'s buffers: the state a training call starts from."""
    return {n: b.detach().clone() for n, b in module.named_buffers()}


GRADIENT_FLOOR_UNITS = 8.0
"""Units of rounding in :func:`gradient_floor`."""


def gradient_floor(dtype: torch.dtype, scale: float, reduced: float) -> float:
    """The absolute error a gradient may carry from rounding alone: ``GRADIENT_FLOOR_UNITS`` units
    of rounding of ``dtype`` at ``scale`` (the largest float64 gradient of the module's inputs and
    parameters in that call: the magnitude the backward computes at), grown with the square root
    of ``reduced`` (output elements per element of the tensor: the length of the sums that make
    it). A gradient whose float64 value is within it is at rounding-noise scale: eager's own is
    noise, so a tolerance relative to eager's would judge noise against noise."""
    return GRADIENT_FLOOR_UNITS * torch.finfo(dtype).eps * scale * math.sqrt(max(reduced, 1.0))


def judged_by_floor(got: torch.Tensor, eager: torch.Tensor, oracle: torch.Tensor, floor: float, case: str,
                    output: int, why: str) -> tuple[bool, Accuracy, str]:
    """A gradient at rounding-noise scale judged against the float64 ``oracle``: accepted when
    the candidate's max abs error is at most ``floor`` (or :data:`ORACLE_MULTIPLE` times eager's,
    if larger) and its NaN and infinities are eager's; (accepted, the :class:`Accuracy` entry,
    ``why`` followed by both errors and the decision)."""
    mine, eagers = oracle_errors(got, oracle), oracle_errors(eager, oracle)
    allowed = max(floor, ORACLE_MULTIPLE * eagers.max_abs)
    ok = math.isfinite(mine.max_abs) and mine.max_abs <= allowed and same_specials(got, eager)
    entry = Accuracy(case=case, output=output, candidate_max_abs=finite_or_none(mine.max_abs),
                     eager_max_abs=finite_or_none(eagers.max_abs), candidate_rel_l2=finite_or_none(mine.rel_l2),
                     eager_rel_l2=finite_or_none(eagers.rel_l2), allowed_multiple=ORACLE_MULTIPLE,
                     absolute_floor=floor, accepted=ok)
    return ok, entry, (f"{why}; at rounding-noise scale (its float64 value is within {floor:.3g}, the floor from "
                       f"the scale of this backward): against the float64 oracle its max abs error is "
                       f"{mine.max_abs:.3g} (eager's {eagers.max_abs:.3g}): "
                       f"{'accepted' if ok else 'still rejected'} (at most {allowed:.3g})")


def same_specials(got: torch.Tensor, eager: torch.Tensor) -> bool:
    """NaN and infinities where eager has them, and nowhere else."""
    nan_ok = torch.equal(torch.isnan(got), torch.isnan(eager))
    inf = torch.isinf(eager)
    return nan_ok and torch.equal(torch.isinf(got), inf) and torch.equal(got[inf], eager[inf])


class _OracleGrads:
    """The original's gradients in float64 for one call: by parameter name and input position,
    and ``scale``, the largest of them in magnitude."""

    def __init__(self, grads: dict[str | int, torch.Tensor]):
        self.grads = grads
        finite = [float(g.abs().nan_to_num(0.0, 0.0, 0.0).max()) for g in grads.values() if g.numel()]
        self.scale = max(finite, default=0.0)


class _Backward:
    """One training call with backward as the original made it: the module, the buffers it started
    from, its inputs, RNG state and output gradients; the float64 oracle of its gradients is
    computed on first use (None: it cannot run so, or a float64 copy would not fit ``room`` bytes)."""

    def __init__(self, module: torch.nn.Module, before: dict[str, torch.Tensor], args: list, kwargs: dict,
                 rng: dict, grad_outputs: list[torch.Tensor], room: int):
        self.module, self.before, self.args, self.kwargs = module, before, args, kwargs
        self.rng, self.grad_outputs, self.room = rng, grad_outputs, room
        self._oracle: _OracleGrads | None = None
        self._tried = False

    def reduced(self, t: torch.Tensor) -> float:
        """Output elements per element of ``t``."""
        return sum(g.numel() for g in self.grad_outputs) / max(t.numel(), 1)

    def oracle(self) -> _OracleGrads | None:
        if not self._tried:
            self._tried = True
            self._oracle = self._compute()
        return self._oracle

    def _compute(self) -> _OracleGrads | None:
        from modulelens.capture import set_rng_states

        weights = sum(t.numel() * t.element_size() for t in self.module.state_dict().values())
        if 2 * weights > self.room:
            return None
        try:
            m = copy.deepcopy(self.module)
            with torch.no_grad():
                for n, b in m.named_buffers():
                    if n in self.before:
                        b.copy_(self.before[n])
            m = m.to(torch.float64).train(True)
            m.zero_grad(set_to_none=True)
            a = [x.detach().to(torch.float64).requires_grad_() if isinstance(x, torch.Tensor) and lower_precision(x)
                 else x for x in self.args]
            set_rng_states(self.rng)
            with torch.enable_grad():
                outs = [o for o in tensors(m(*a, **dict(zip(self.kwargs, float64_args(list(self.kwargs.values()))))))
                        if o.requires_grad]
            if len(outs) != len(self.grad_outputs) or any(o.dtype != torch.float64 for o in outs):
                return None
            torch.autograd.backward(outs, [g.to(o.device, o.dtype) for g, o in zip(self.grad_outputs, outs)])
        except Exception:  # noqa: BLE001 - a module that cannot run in float64 has no oracle
            return None
        grads: dict[str | int, torch.Tensor] = {n: p.grad for n, p in m.named_parameters() if p.grad is not None}
        grads.update({i: x.grad for i, x in enumerate(a) if isinstance(x, torch.Tensor) and x.grad is not None})
        return _OracleGrads(grads)


def _index(key: str) -> int:
    return int(key.rsplit(".", 1)[1])
