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

Shape rule: a candidate may declare the dimensions of ``forward``'s inputs it takes at other sizes
(``# modulelens-variable-dims: 0.0 0.1`` in its source, positions counting ``forward``'s arguments
then its keyword arguments, see :mod:`modulelens.kernels.shape_rules`). After the checks above it
is checked on fresh inputs at sizes that were not captured (:func:`~modulelens.validation.shape_rules.shape_rule_cases`),
eval like the others and, for a candidate that claims training support, training forward and
gradients against the original module's; the report's ``shape_rule`` records it as checked, and
a pack entry admits calls by it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from modulelens.kernels import declared_rule
from modulelens.validation.checker import ModuleCall
from modulelens.validation.inputs import FRESH_STATE, fresh_inputs, fresh_state, tensors
from modulelens.validation.messages import ValidateModuleTask
from modulelens.validation.report import ValidationReport
from modulelens.validation.shape_rules import checked_rule, rule_problem, shape_rule_cases


class ModuleChecks:
    """The steps of the module checker kept here (see the module docstring). The checker provides
    what they use: its task and report, the captured state and device, ``check`` and ``call``
    (:class:`~modulelens.validation.checker.CandidateChecker`), ``load_state``, and its own
    ``run_original``, ``check_case`` and ``values_problem``."""

    task: ValidateModuleTask
    report: ValidationReport
    rtol: float | None
    captured_state: dict[str, torch.Tensor]
    captured_device: str
    on_captured_device: bool
    check: Any
    call: Any
    load_state: Any
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
        ref_inputs, want_params, grad_out = _reference_backward(reference, args, kwargs, rng)
        return self.compare_gradients(reference, args, kwargs, rng, f"gradients against the original module, {label}",
                                      grad_out, want_params, {i: g for i, g in enumerate(ref_inputs) if g is not None})

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
        reference.load_state_dict(self.captured_state)
        error = self.load_state(self.captured_state)
        if error:
            return f"cannot take the captured parameters back ({error})"
        return None

    # -- training ---------------------------------------------------------------------------------
    def check_training(self, loaded: Any, reference: torch.nn.Module, args: list, kwargs: dict,
                       expected: Any) -> str | None:
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
            problem = self.values_problem(got.outputs, expected, label)
            if problem:
                return problem
        else:
            self.check(label, True, f"skipped: captured on {self.captured_device} (random draws and rounding differ "
                       "by device); checked against the original module on this device instead")
        return self.check_gradients(loaded, reference, args, kwargs, captured_rng)

    def check_gradients(self, loaded: Any, reference: torch.nn.Module, args: list, kwargs: dict,
                        rng: dict) -> str | None:
        captured = self.on_captured_device and loaded.artifact.has_file("grads.safetensors")
        grads = loaded.grads() if captured else {}
        captured_out = [grads[k] for k in sorted((k for k in grads if k.startswith("grad_output.")), key=_index)]
        if captured_out:
            label = "gradients, against the captured gradients"
            grad_out = captured_out
            want_params = {k.removeprefix("param."): v for k, v in grads.items() if k.startswith("param.")}
            want_inputs = {int(k.split(".")[1]): v for k, v in grads.items() if k.startswith("grad_input.")}
        else:
            why = "no captured gradients" if self.on_captured_device else f"captured on {self.captured_device}"
            label = f"gradients, against the original module ({why})"
            ref_inputs, want_params, grad_out = _reference_backward(reference, args, kwargs, rng)
            want_inputs = {i: g for i, g in enumerate(ref_inputs) if g is not None}
        return self.compare_gradients(reference, args, kwargs, rng, label, grad_out, want_params, want_inputs)

    def compare_gradients(self, reference: torch.nn.Module, args: list, kwargs: dict, rng: dict, label: str,
                          grad_out: list[torch.Tensor], want_params: dict[str, torch.Tensor],
                          want_inputs: dict[int, torch.Tensor]) -> str | None:
        """The candidate's parameter and input gradients for ``grad_out`` against the wanted ones."""
        room = sum(p.numel() * p.element_size() + 64 for p in reference.parameters())
        room += sum(a.numel() * a.element_size() + 64 for a in args if isinstance(a, torch.Tensor))
        want = tensors(self.run_original(reference, args, kwargs, True, rng))
        got = self.call(args, kwargs, want, trace=False, label=label,
                        module_call=ModuleCall(True, rng, [g.detach() for g in grad_out], grad_room=room))
        inputs, params = got.input_grads, got.param_grads
        for name, w in want_params.items():
            if name not in params:
                self.check(f"{label}: {name}", False, "no gradient")
                return f"parameter {name} gets no gradient ({label})"
            problem = self.values_problem([params[name]], [w], f"{label}: {name}", rtol=self.rtol or 1e-4)
            if problem:
                return problem
        for i, w in want_inputs.items():
            if i < len(inputs) and inputs[i] is not None:
                problem = self.values_problem([inputs[i]], [w], f"{label}: input {i}", rtol=self.rtol or 1e-4)
                if problem:
                    return problem
        return None


def _newly_non_finite(outputs: list[torch.Tensor], base: list[torch.Tensor]) -> bool:
    """Some floating output is not finite where the original with the captured state was."""
    for o, b in zip(outputs, base):
        if o.is_floating_point() and b.shape == o.shape and bool(torch.isfinite(b).all()) and not bool(
                torch.isfinite(o).all()):
            return True
    return False


def _reference_backward(module: torch.nn.Module, args: list, kwargs: dict, rng: dict) -> tuple[list, dict, list]:
    """The original module's input and parameter gradients for a random output gradient (also returned)."""
    from modulelens.capture import set_rng_states

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
