"""Where NaN/Inf is born: a check of every step, for the rerun that gather-stats makes when a
sampled step held NaN/Inf.

:class:`NonfiniteSentinel` watches a training run from its first step: the weights of the model
before each step's forward, every module's floating inputs and outputs, the gradient w.r.t. every
module input and output that requires grad, every parameter's gradient before ``optimizer.step()``
and every weight after it. Each check is one reduction (``sum`` in float64: NaN and Inf survive
it, and float32/bfloat16 values cannot overflow it) that stays on the device; at the end of each
step the checks move to the host in one transfer and are read in the order they were taken. The
first one that is not finite says where NaN/Inf was born (:class:`~modulelens.stats.schema.NanOrigin`):

- a weight before the first forward: initialisation or a loaded checkpoint (forward, weight);
- a weight before a later forward, finite after the previous ``optimizer.step()``: code outside the
  optimizer wrote it (forward, weight);
- a module's input: from the data, or from the code of the module calling it (forward, input or
  output of the caller);
- a module's output while its inputs and everything it called were finite (forward, output);
- the gradient w.r.t. a module's input while the gradient at its output was finite: its backward
  (backward, gradient); w.r.t. the model's output: the loss;
- a parameter's gradient while every activation gradient was finite (backward, gradient);
- a weight after ``optimizer.step()`` while its gradient was finite (optimizer, weight).

The run stops (:class:`~modulelens.stats.collector.StopRun`) at the end of the step where it was
found, or after ``stop_step`` without finding any (the script did not repeat itself).
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from modulelens.stats.collector import StopRun
from modulelens.stats.compiled import in_backward
from modulelens.stats.naming import ModuleNames
from modulelens.stats.schema import NanOrigin
from modulelens.stats.window import floating_tensors
from modulelens.wrappers import is_wrapper


def finite_check(t: torch.Tensor) -> torch.Tensor:
    """A 0-d float64 tensor that is finite exactly when ``t`` holds no NaN/Inf (no synchronisation)."""
    x = t.detach()
    if x.is_complex():
        x = torch.view_as_real(x)
    return x.sum(dtype=torch.float64)


@dataclass
class _Check:
    """One check of a step: what was checked (``what``), with the names it concerns."""

    what: str  # weights-before, input, output, grad, param-grads, weights-after
    module: str = ""
    parent: str | None = None  # input: the recorded call it was made in
    names: list[str] = field(default_factory=list)  # parameter names (weights-*, param-grads)
    consumers: list[str] = field(default_factory=list)  # grad: the modules that took the tensor as input


class NonfiniteSentinel:
    """Checks every step of a run for NaN/Inf and stops at the first step that holds any (see the
    module docstring). ``stop_step``: the last step to check; ``deadline``: ``time.monotonic()``
    after which the run stops at the next step boundary; ``step_on``: as for the collector (a step
    ends at ``optimizer.step()``, or at the next top-level call of the model)."""

    def __init__(self, stop_step: int, deadline: float | None = None, step_on: str = "optimizer"):
        self.stop_step = stop_step
        self.deadline = deadline
        self.step_on = step_on
        self._root_calls = 0
        self.notes: list[str] = []
        self.names = ModuleNames(None, self.notes)
        self.step = 0
        self.origin: NanOrigin | None = None
        self._checks: list[_Check] = []
        self._values: list[torch.Tensor] = []
        self._stack: list[str | None] = []
        self._targets: dict[tuple[int, int], tuple[weakref.ref, _Check]] = {}
        self._hooks: list[Any] = []
        self._tensor_hooks: list[Any] = []
        self._primary: weakref.ref | None = None
        self._started = time.monotonic()
        self._weights_checked = False

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> NonfiniteSentinel:
        self._hooks = [register_module_forward_pre_hook(self._pre), register_module_forward_hook(self._post),
                       register_optimizer_step_pre_hook(self._opt_pre), register_optimizer_step_post_hook(self._opt_post)]
        return self

    def stop(self) -> None:
        for h in self._hooks + self._tensor_hooks:
            h.remove()
        self._hooks, self._tensor_hooks = [], []
        if self.origin is None and self._checks:
            self._judge()

    def result(self, detail: str = "") -> NanOrigin:
        """The origin found, or why there is none."""
        if self.origin is not None:
            return self.origin
        return NanOrigin(found=False, steps_checked=self.step, seconds=time.monotonic() - self._started,
                         detail=detail or f"the rerun reached step {self.step} without NaN/Inf: the script does not "
                         "repeat itself (unseeded randomness, data order, nondeterministic kernels)")

    # -- checks -------------------------------------------------------------------------------
    def _add(self, check: _Check, value: torch.Tensor) -> None:
        self._checks.append(check)
        self._values.append(value.reshape(()))

    def _add_params(self, what: str, named: list[tuple[str, torch.Tensor]]) -> None:
        named = [(n, t) for n, t in named if t.is_floating_point() and t.numel()]
        if not named:
            return
        # Norms in float64: squares of float32/bfloat16 values cannot overflow there.
        for (n, _), v in zip(named, torch._foreach_norm([t.detach() for _, t in named], 2, dtype=torch.float64)):
            self._add(_Check(what, names=[n]), v)

    def _root_weights(self) -> list[tuple[str, torch.Tensor]]:
        return [(self.names.param_names[id(p)][0], p) for r in self.names.roots for p in r.parameters()
                if id(p) in self.names.param_names]

    def _grad_hook(self, t: torch.Tensor, check: _Check) -> None:
        key = (id(t), t._version)
        entry = self._targets.get(key)
        if entry is not None and entry[0]() is t:
            known = entry[1]
            known.consumers += [c for c in check.consumers if c not in known.consumers]
            known.module = known.module or check.module
            return
        self._targets[key] = (weakref.ref(t), check)

        def hook(g: torch.Tensor, check=check) -> None:
            if g is not None:
                self._add(check, finite_check(g))

        self._tensor_hooks.append(t.register_hook(hook))

    # -- hooks --------------------------------------------------------------------------------
    def _pre(self, module: nn.Module, args: tuple) -> None:
        if in_backward():
            return
        name = self.names.lookup(module)
        if name is None and not self._stack:
            self.names.adopt_root(module)
            name = self.names.lookup(module)
        elif name is None and self._stack and self._stack[-1] is not None:
            name = self.names.name_unregistered(module, self._stack[-1])
        if is_wrapper(module):
            name = None
        if self.step_on == "forward" and not self._stack and self.names.is_root(module):
            if self._root_calls:
                self._end_step()  # the previous model call's step is over
            self._root_calls += 1
        parent = next((n for n in reversed(self._stack) if n is not None), None)
        self._stack.append(name)
        if name is None:
            return
        if not self._weights_checked:
            self._weights_checked = True
            self._add_params("weights-before", self._root_weights())
        for t in floating_tensors(args):
            self._add(_Check("input", module=name, parent=parent), finite_check(t))
            if t.requires_grad and torch.is_grad_enabled():
                self._grad_hook(t, _Check("grad", consumers=[name]))

    def _post(self, module: nn.Module, args: tuple, output: Any) -> None:
        if in_backward() or not self._stack:
            return
        name = self._stack.pop()
        if name is None:
            return
        for t in floating_tensors(output):
            self._add(_Check("output", module=name), finite_check(t))
            if t.requires_grad and torch.is_grad_enabled():
                self._grad_hook(t, _Check("grad", module=name))

    def _opt_pre(self, opt: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        if self._primary is None:
            self._primary = weakref.ref(opt)
        named = [(self.names.param_names[id(p)][0], p.grad) for g in opt.param_groups for p in g["params"]
                 if p.grad is not None and id(p) in self.names.param_names and p.grad.layout == torch.strided]
        self._add_params("param-grads", named)

    def _opt_post(self, opt: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        named = [(self.names.param_names[id(p)][0], p) for g in opt.param_groups for p in g["params"]
                 if id(p) in self.names.param_names]
        self._add_params("weights-after", named)
        primary = self._primary() if self._primary is not None else None
        if self.step_on != "optimizer" or (primary is not None and primary is not opt):
            return
        self._end_step()

    def _end_step(self) -> None:
        self._judge()
        for h in self._tensor_hooks:
            h.remove()
        self._tensor_hooks.clear()
        self._targets.clear()
        self._weights_checked = False
        if self.origin is not None or self.step >= self.stop_step:
            self.stop()
            raise StopRun()
        self.step += 1
        if self.deadline is not None and time.monotonic() > self.deadline:
            self.stop()
            self.origin = self.result(f"the rerun was stopped at its time limit after {self.step} step(s)")
            raise StopRun()

    # -- reading the checks -------------------------------------------------------------------
    def _judge(self) -> None:
        checks, values = self._checks, self._values
        self._checks, self._values = [], []
        if not values:
            return
        finite = [True] * len(values)
        by_device: dict[torch.device, list[int]] = {}
        for i, v in enumerate(values):
            by_device.setdefault(v.device, []).append(i)
        for idx in by_device.values():  # one transfer per device
            for i, ok in zip(idx, torch.isfinite(torch.stack([values[i].to(torch.float64) for i in idx])).tolist()):
                finite[i] = ok
        bad = next((i for i, ok in enumerate(finite) if not ok), None)
        if bad is not None:
            self.origin = self._origin(checks[bad], checks[:bad])

    def _owner(self, param: str) -> str:
        return next((o for n, o in self.names.param_names.values() if n == param), "")

    def _origin(self, c: _Check, before: list[_Check]) -> NanOrigin:
        step = self.step
        base = {"found": True, "step": step, "steps_checked": step + 1, "seconds": time.monotonic() - self._started}
        if c.what == "weights-before":
            p = c.names[0]
            detail = (f"{p} held NaN/Inf before the first step: the initialisation or a loaded checkpoint put them there."
                      if step == 0 else f"{p} was finite after optimizer.step() of step {step - 1} and holds NaN/Inf "
                      f"before the forward of step {step}: code outside the optimizer wrote it.")
            return NanOrigin(**base, phase="forward", tensor="weight", module=self._owner(p), parameter=p,
                             seen_in=f"{p} before the forward", detail=detail)
        if c.what == "input":
            if c.parent is not None:
                return NanOrigin(**base, phase="forward", tensor="output", module=c.parent, seen_in=f"input of {c.module}",
                                 detail=f"The code of {c.parent or 'the root'}'s forward made them before it called "
                                 f"{c.module}: its own inputs and every module it called before were finite.")
            return NanOrigin(**base, phase="forward", tensor="input", module=c.module, seen_in=f"input of {c.module}",
                             detail="The model's input held them: they come from the data or from code outside the "
                             "model's modules.")
        if c.what == "output":
            return NanOrigin(**base, phase="forward", tensor="output", module=c.module, seen_in=f"output of {c.module}",
                             detail="Its output holds NaN/Inf while its inputs and weights, and every module it called, "
                             "were finite.")
        if c.what == "grad":
            if c.consumers:
                m = c.consumers[-1]
                return NanOrigin(**base, phase="backward", tensor="gradient", module=m,
                                 seen_in=f"gradient w.r.t. the input of {m}",
                                 detail=f"The gradient at the output of {m} was finite; its backward made the gradient "
                                 "w.r.t. its input NaN/Inf (the forward of this step was finite).")
            return NanOrigin(**base, phase="backward", tensor="gradient", module=c.module,
                             seen_in=f"gradient w.r.t. the output of {c.module or 'the model'}",
                             detail=f"The first NaN/Inf gradient arrives at the output of {c.module or 'the model'}: "
                             "the loss (or code after the module) made it; the forward of this step was finite.")
        p = c.names[0]
        if c.what == "param-grads":
            return NanOrigin(**base, phase="backward", tensor="gradient", module=self._owner(p), parameter=p,
                             seen_in=f"gradient of {p}",
                             detail=f"The gradient of {p} holds NaN/Inf while every activation gradient was finite: "
                             "the backward of its module made it.")
        return NanOrigin(**base, phase="optimizer", tensor="weight", module=self._owner(p), parameter=p,
                         seen_in=f"{p} after optimizer.step()",
                         detail=f"{p} turned NaN/Inf in optimizer.step() of step {step} while its gradient was finite.")
