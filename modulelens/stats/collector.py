"""Per-module training statistics, taken only on sampled steps.

:class:`StatsCollector` marks step boundaries with global optimizer hooks
(``register_optimizer_step_pre_hook`` / ``..._post_hook``: cheap, always installed). A step is
*sampled* when ``step % every == 0`` (steps count from 0). Global module hooks
(``register_module_forward_pre_hook`` / ``register_module_forward_hook``) are installed when a
sampled step begins (right after the previous ``optimizer.step()``) and removed when it ends (after
its own ``optimizer.step()``), so unsampled steps run with no module hook at all. On a sampled step:

- the forward pre-hook notes the call order and the L2 norm of the module's floating inputs (its
  scale, and whether they hold NaN/Inf);
- the forward hook reduces each floating output to a moment vector (:mod:`modulelens.stats.stats`)
  and registers a *tensor* hook on it for the gradient w.r.t. that output (full module backward
  hooks are not used: they break on in-place activations such as ``ReLU(inplace=True)``);
- the optimizer pre-hook takes the norms of the parameters and their ``.grad`` (fused ``_foreach``
  calls) and keeps a copy of the weights; the post-hook measures the update-to-weight ratio
  ``||w_after - w_before|| / ||w_before||`` (exact up to 65,536 elements; for larger parameters on
  every s-th row, about 65,536 elements, which avoids copying every weight; whole rows are contiguous
  in memory, so the copy reads few cache lines).

Under ``torch.compile`` (dynamo enabled), sampled steps run the compiled code eagerly (dynamo's
``force_eager`` stance, restored when the step ends): module hooks do not run inside compiled code,
and hooks traced into it would cause graph breaks and recompiles. Their statistics are exact; the
other steps run compiled.

Everything stays on the tensors' device until the step ends, then moves to the host in one
transfer. Modules are named as in ``root.named_modules()`` (wrapper prefixes of DDP/FSDP/
``torch.compile`` stripped), the root being the first top-level module called that has parameters
(or the model you pass). Calls made during backward (activation checkpointing recomputation) and
under ``torch.no_grad`` after the step's forward (e.g. evaluation) are not counted as training
activity: only calls with grad enabled are recorded, unless ``record_no_grad`` is set.

Use it around your own loop::

    from modulelens.stats import StatsCollector
    with StatsCollector(model, every=10, name="run1") as stats:
        for x, y in loader:
            loss = loss_fn(model(x), y); opt.zero_grad(); loss.backward(); opt.step()
    print(stats.artifact.ref, stats.findings)
"""

from __future__ import annotations

import collections
import math
import os
import sys
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn as nn
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from modulelens.stats import stats as S
from modulelens.stats.order import combine_order, execution_order, fx_leaf_order, merge_observed
from modulelens.stats.records import ModuleStep, ParamStep, StatsRun, StepRecord
from modulelens.stats.series import DEFAULT_EMA
from modulelens.stats.updates import UpdateMeasurement, scalars_to_host, update_sample
from modulelens.wrappers import WRAPPER_CLASSES, is_wrapper, strip_wrapper_prefix

# The data model, order and update helpers used to live here; their names stay importable.
__all__ = [
    "DEFAULT_EVERY", "WRAPPER_CLASSES", "ModuleStep", "ParamStep", "StatsCollector", "StatsRun", "StepOn", "StepRecord", "StopRun",
    "combine_order", "fx_leaf_order", "update_sample",
]

DEFAULT_EVERY = 10  # statistics on steps 0, 10, 20, ...
StepOn = Literal["optimizer", "forward", "manual"]


class StopRun(BaseException):
    """Raised out of the user's ``optimizer.step()`` once the requested number of steps ran.
    A BaseException so that a user's ``except Exception`` does not swallow it."""


# --------------------------------------------------------------------------------------------
# Per-window bookkeeping (device tensors until the step ends)
# --------------------------------------------------------------------------------------------


@dataclass
class _Reduced:
    vec: torch.Tensor | list[float]


@dataclass
class _Call:
    module: nn.Module
    name: str | None  # None: not recorded (wrapper, outside the roots, grad disabled)
    finish: int = -1
    # L2 norms of the floating inputs; a _Reduced input is the output of an earlier call of this step
    # (its moment vector gives the norm without another pass).
    in_norms: list[torch.Tensor | float | _Reduced] = field(default_factory=list)
    in_numel: int = 0
    out: list[torch.Tensor | list[float]] = field(default_factory=list)


@dataclass
class _Window:
    step: int
    calls: list[_Call] = field(default_factory=list)  # recorded calls, in start order
    stack: list[_Call] = field(default_factory=list)
    finished: int = 0
    grads: dict[str, list[tuple[int, torch.Tensor | list[float]]]] = field(default_factory=dict)
    grad_seq: int = 0
    grad_targets: dict[tuple[int, int], tuple[weakref.ref, list[str]]] = field(default_factory=dict)
    tensor_hooks: list[Any] = field(default_factory=list)
    memo: collections.deque = field(default_factory=lambda: collections.deque(maxlen=8))
    params_seen: set[int] = field(default_factory=set)
    updates: UpdateMeasurement = field(default_factory=UpdateMeasurement)
    open: bool = True


def _floating_tensors(value: Any, depth: int = 0) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value] if (value.is_floating_point() or value.is_complex()) and value.numel() else []
    if depth > 3:
        return []
    if isinstance(value, (list, tuple)):
        return [t for v in value[:64] for t in _floating_tensors(v, depth + 1)]
    if isinstance(value, dict):
        return [t for v in list(value.values())[:64] for t in _floating_tensors(v, depth + 1)]
    if hasattr(value, "__dataclass_fields__") and not isinstance(value, type):
        return [t for f in value.__dataclass_fields__ for t in _floating_tensors(getattr(value, f, None), depth + 1)]
    return []


def _saturation_of(module: nn.Module) -> tuple[float, float] | None:
    name = type(module).__name__
    if name == "Hardtanh" or isinstance(module, nn.Hardtanh):
        lo, hi = float(module.min_val), float(module.max_val)
        return ((lo + hi) / 2, (hi - lo) / 2)
    return S.SATURATING.get(name)


def _dynamo_disabled() -> bool:
    if os.environ.get("TORCHDYNAMO_DISABLE") == "1":
        return True
    dynamo = sys.modules.get("torch._dynamo")
    return bool(dynamo is not None and getattr(dynamo.config, "disable", False))


def _force_eager() -> Callable[[], None] | None:
    """Make ``torch.compile``d code run eagerly (dynamo's ``force_eager`` stance) until the returned
    function restores the previous stance; None when dynamo is not in use (not imported, disabled)
    or the stance cannot be set here. Module hooks do not run inside compiled code, and hooks added
    to compiled code cause graph breaks and recompiles: sampled steps run eagerly instead, so their
    statistics are exact and the compiled graphs of the other steps stay as they are."""
    if "torch._dynamo" not in sys.modules or _dynamo_disabled():
        return None
    try:
        from torch._dynamo import eval_frame

        prior = eval_frame._set_stance(eval_frame.DynamoStance("force_eager"))
    except Exception:  # noqa: BLE001 - private API, or called inside a compiled region
        return None
    return lambda: eval_frame._set_stance(prior)


def _in_backward() -> bool:
    try:
        return torch._C._current_graph_task_id() != -1
    except Exception:  # noqa: BLE001 - private API; assume not
        return False


class StatsCollector:
    """Gather per-module statistics on every ``every``-th training step.

    ``model``: the root module (None: the first top-level module called that has parameters).
    ``step_on``: ``"optimizer"`` (a step ends at each ``optimizer.step()`` of the first optimizer
    that steps), ``"forward"`` (each top-level call of the root starts a step: inference loops or
    manual updates), ``"manual"`` (call :meth:`step` yourself). ``max_steps`` raises
    :class:`StopRun` out of the step that reaches it (used by the script worker).
    ``name``/``repo``: where :meth:`save` (and leaving the ``with`` block) stores the run.
    ``sample``: estimate mean/std/skewness/kurtosis (and so KL and rms) of tensors larger than this
    from a fixed strided view of about that many elements (:data:`~modulelens.stats.stats.DEFAULT_SAMPLE`
    = 65,536 by default); zero fraction, min, max, NaN/Inf and saturation counts always cover every
    element. ``None`` or ``0``: everything exact.
    """

    def __init__(
        self,
        model: nn.Module | None = None,
        *,
        every: int = DEFAULT_EVERY,
        max_steps: int | None = None,
        step_on: StepOn = "optimizer",
        params: bool = True,
        gradients: bool = True,
        record_no_grad: bool = False,
        fx: bool = True,
        ema: float = DEFAULT_EMA,
        name: str | None = None,
        repo: str | os.PathLike[str] | None = None,
        plots: bool = True,
        thresholds: dict[str, float] | None = None,
        sample: int | None = S.DEFAULT_SAMPLE,
    ):
        if every < 1:
            raise ValueError("every must be 1 or more")
        self.every = every
        self.max_steps = max_steps
        self.step_on = step_on
        self.params = params
        self.gradients = gradients
        self.record_no_grad = record_no_grad
        self.fx = fx
        self.ema = ema
        self.name = name
        self.repo = repo
        self.plots = plots
        self.thresholds = thresholds or {}
        self.sample = sample or None
        self.explicit_root = model is not None
        self.roots: list[nn.Module] = [model] if model is not None else []
        self.current_step = 0
        self.steps_seen = 0
        self.records: list[StepRecord] = []
        self.notes: list[str] = []
        self.compiled = False
        self.eager_sampled_steps = 0  # sampled steps run with compiled code forced eager
        self._restore_stance: Callable[[], None] | None = None
        self.artifact: Any = None
        self.findings: list[dict[str, Any]] = []
        self._names: dict[int, tuple[weakref.ref, str]] = {}
        self._param_names: dict[int, tuple[str, str]] = {}  # id(param) -> (name, owner module)
        self._param_shapes: dict[str, list[int]] = {}
        self._types: dict[str, str] = {}
        self._class_paths: dict[str, str] = {}
        self._order: list[str] = []
        self._unnamed: dict[int, tuple[weakref.ref, str]] = {}
        self._win: _Window | None = None
        self._module_hooks: list[Any] = []
        self._opt_hooks: list[Any] = []
        self._root_hooks: list[Any] = []
        self._primary_opt: weakref.ref | None = None
        self._root_calls = 0
        self._root_call_handled = False
        self._errors = 0
        self._active = False
        self.deadline: float | None = None  # time.monotonic() after which the next step ends the run
        self._run: StatsRun | None = None
        if self.roots:
            self._discover()

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> StatsCollector:
        if self._active:
            return self
        self._active = True
        if self.step_on != "manual" or self.params:
            self._opt_hooks = [
                register_optimizer_step_pre_hook(self._opt_pre),
                register_optimizer_step_post_hook(self._opt_post),
            ]
        if self.step_on == "forward":
            for r in self.roots:
                self._watch_root(r)
            self._root_calls = 0
        if self._sampled(self.current_step):
            self._open_window()
        return self

    def stop(self) -> None:
        """Remove every hook. A sampled step still open is kept if it saw any call, and with
        ``step_on="forward"`` the step in progress (the last model call, which no later call ends)
        is counted in ``steps_seen``."""
        if not self._active:
            return
        self._active = False
        if self.step_on == "forward" and self._root_calls > self.steps_seen:
            self.steps_seen = self._root_calls  # each root call began a step; the last one ends here
        if self._win is not None:
            self._close_window(keep=True)
        self._set_module_hooks(False)
        for h in self._opt_hooks + self._root_hooks:
            h.remove()
        self._opt_hooks.clear()
        self._root_hooks.clear()

    def __enter__(self) -> StatsCollector:
        return self.start()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        """Stop, and save what was gathered, also when the loop failed (a NaN assertion, say):
        those statistics are the ones that explain it. A StopRun (``max_steps``) ends quietly."""
        self.stop()
        stopped = exc_type is not None and issubclass(exc_type, StopRun)
        if exc_type is not None and not stopped:
            self.notes.append(f"the training loop raised {exc_type.__name__}: {exc}; statistics cover the steps before it")
        if self.records:
            try:
                self.save()
            except Exception:
                if exc_type is None or stopped:
                    raise  # otherwise the loop's own exception is the one to see
        return stopped

    def step(self) -> None:
        """End the current step yourself (``step_on="manual"``; with the other modes it would count
        a step twice)."""
        self._end_step()

    # -- results ------------------------------------------------------------------------------
    def finish(self) -> StatsRun:
        """Stop collecting and return what was gathered (with the execution order)."""
        self.stop()
        if self._run is None:
            order, source, fx_note = execution_order(self._order, self.roots[0] if self.roots else None, self.fx)
            notes = list(self.notes)
            if fx_note:
                notes.append(fx_note)
            if self.compiled and self.eager_sampled_steps:
                notes.append(
                    "the model is compiled with torch.compile: the sampled steps ran it in eager mode (torch.compiler "
                    "stance force_eager), so their statistics are exact; the other steps ran compiled"
                )
            elif self.compiled:
                notes.append(
                    "the model is compiled with torch.compile: module hooks do not run inside compiled code, so "
                    "submodules of the compiled model were not observed; gather statistics in eager mode "
                    "(the modulelens gather-stats command does this by default; in your own code, skip "
                    "torch.compile for the statistics run or set TORCHDYNAMO_DISABLE=1)"
                )
            if self.records and not any(r.modules for r in self.records):
                notes.append(
                    "no module call was observed on the sampled steps: the model may run compiled "
                    "(torch.compile/TorchScript) or under torch.no_grad (use record_no_grad)"
                )
            if self.steps_seen == 0 and self.step_on == "optimizer" and self.records:
                notes.append(
                    "no optimizer.step() was seen: all forward calls of the run were merged into step 0; "
                    "use step_on='forward' (--step-on forward) for loops without an optimizer"
                )
            self._run = StatsRun(
                records=self.records, order=order, order_source=source, types=dict(self._types),
                class_paths=dict(self._class_paths), param_shapes=dict(self._param_shapes), every=self.every,
                steps_seen=self.steps_seen, step_on=self.step_on, notes=notes, compiled=self.compiled,
                sample=self.sample,
            )
        return self._run

    def save(self, name: str | None = None, repo: str | os.PathLike[str] | None = None, *,
             run: StatsRun | None = None, **meta: Any):
        """Store the run (this collector's, or ``run``, e.g. merged over ranks) as a ``stats`` artifact
        (series, findings, report); returns the artifact."""
        from modulelens.repo import Repository, default_repo_root
        from modulelens.stats.artifact import default_stats_name, save_run

        run = run or self.finish()
        main = sys.modules.get("__main__")
        caller = getattr(main, "__file__", None)
        name = name or self.name or default_stats_name(Path(caller) if caller else None)
        root = repo if repo is not None else (self.repo if self.repo is not None else default_repo_root())
        self.artifact, self.findings = save_run(
            Repository(root), name, run, ema=self.ema, plots=self.plots, thresholds=self.thresholds,
            source={"kind": "api", "script": caller, "argv": list(sys.argv), "cwd": os.getcwd(), **meta},
        )
        return self.artifact

    # -- names --------------------------------------------------------------------------------
    def _discover(self) -> None:
        self._names.clear()
        self._param_names.clear()
        for i, root in enumerate(self.roots):
            prefix = "" if i == 0 else type(root).__name__
            for qual, m in root.named_modules(remove_duplicate=False):
                name = strip_wrapper_prefix(qual)
                if prefix:
                    name = f"{prefix}/{name}" if name else prefix
                if id(m) not in self._names:
                    self._names[id(m)] = (weakref.ref(m), name)
            for qual, p in root.named_parameters():
                name = strip_wrapper_prefix(qual)
                owner = name.rsplit(".", 1)[0] if "." in name else ""
                if prefix:
                    name, owner = f"{prefix}/{name}", (f"{prefix}/{owner}" if owner else prefix)
                self._param_names.setdefault(id(p), (name, owner))
                self._param_shapes[name] = list(p.shape)
            if type(root).__name__ == "OptimizedModule" and not _dynamo_disabled():
                self.compiled = True

    def _lookup(self, module: nn.Module) -> str | None:
        entry = self._names.get(id(module))
        if entry is not None and entry[0]() is module:
            return entry[1]
        return None

    def _maybe_root(self, module: nn.Module) -> None:
        """A top-level call of an unnamed module: adopt it as a root when it has parameters."""
        if self.explicit_root:
            return
        if next(module.parameters(), None) is None:
            return  # a loss function or other parameter-free helper
        contained = [r for r in self.roots if any(m is r for m in module.modules())]
        if contained:  # the script called a submodule first; this one holds it: it is the root
            self.roots = [module] + [r for r in self.roots if not any(r is c for c in contained)]
        else:
            self.roots.append(module)
        self._discover()
        if self.step_on == "forward":
            self._watch_root(module)
            self._root_calls = 1

    def _unnamed_name(self, module: nn.Module, parent: _Call | None) -> str | None:
        """Modules called inside the model but not registered as submodules (kept in a plain list,
        created on the fly): named after their caller, e.g. ``blocks.0.<ReLU>``."""
        entry = self._unnamed.get(id(module))
        if entry is not None and entry[0]() is module:
            return entry[1]
        if parent is None or parent.name is None:
            return None
        base = f"{parent.name}.<{type(module).__name__}>" if parent.name else f"<{type(module).__name__}>"
        taken = {n for _, n in self._unnamed.values()}
        name, k = base, 2
        while name in taken:
            name, k = f"{base}#{k}", k + 1
        self._unnamed[id(module)] = (weakref.ref(module), name)
        if len(self._unnamed) == 1:
            self.notes.append(
                f"some modules are not registered submodules of the model (e.g. kept in a plain list); "
                f"they are named after their caller, like {name}"
            )
        return name

    # -- hooks: installation ------------------------------------------------------------------
    def _sampled(self, step: int) -> bool:
        return step % self.every == 0

    def _set_module_hooks(self, on: bool) -> None:
        if on and not self._module_hooks:
            self._module_hooks = [
                register_module_forward_pre_hook(self._pre),
                register_module_forward_hook(self._post, always_call=True),
            ]
        elif not on and self._module_hooks:
            for h in self._module_hooks:
                h.remove()
            self._module_hooks = []

    def _watch_root(self, root: nn.Module) -> None:
        self._root_hooks.append(root.register_forward_pre_hook(self._root_pre))

    def _open_window(self) -> None:
        self._win = _Window(step=self.current_step)
        if self._restore_stance is None:
            self._restore_stance = _force_eager()
        self._set_module_hooks(True)

    def _close_window(self, keep: bool = True) -> None:
        win = self._win
        self._win = None
        if win is None:
            return
        win.open = False
        if self._restore_stance is not None:
            self._restore_stance()
            self._restore_stance = None
            self.eager_sampled_steps += bool(win.calls)
        S.release_scratch()
        for h in win.tensor_hooks:
            h.remove()
        win.tensor_hooks.clear()
        if not self._active or not self._sampled(self.current_step + 1):
            self._set_module_hooks(False)
        if keep and (win.calls or win.updates.norms):
            try:
                self.records.append(self._materialize(win))
            except Exception as e:  # noqa: BLE001 - statistics must never break the user's run
                self._note_error("finishing a sampled step", e)

    def _end_step(self) -> None:
        if self._win is not None:
            self._close_window()
        self.current_step += 1
        self.steps_seen += 1
        if self.max_steps is not None and self.steps_seen >= self.max_steps:
            self.stop()
            raise StopRun()
        if self.deadline is not None and time.monotonic() > self.deadline:
            self.notes.append(f"the run was stopped after {self.steps_seen} steps at the time limit (--timeout)")
            self.stop()
            raise StopRun()
        if self._active and self._sampled(self.current_step):
            self._open_window()

    def _note_error(self, where: str, e: BaseException) -> None:
        self._errors += 1
        if self._errors <= 3:
            self.notes.append(f"statistics skipped while {where}: {type(e).__name__}: {e}")

    # -- hooks: modules -----------------------------------------------------------------------
    def _pre(self, module: nn.Module, args: tuple, advance: bool = True) -> None:
        win = self._win
        if win is None or _in_backward():
            return
        try:
            parent = win.stack[-1] if win.stack else None
            if self.step_on == "forward" and parent is None and self._is_root(module):
                # A top-level call of the root: a new step begins (forward-mode steps).
                self._root_call_handled = True  # the root's own pre-hook runs next: nothing left to do
                if advance and self._root_calls > 0:
                    self._end_step()
                    win = self._win
                    if win is None:
                        return
                self._root_calls += 1
            name = self._lookup(module)
            if name is None and parent is None:
                self._maybe_root(module)
                name = self._lookup(module)
            elif name is None and parent is not None and parent.name is not None:
                name = self._unnamed_name(module, parent)
            record = name is not None and not is_wrapper(module)
            if record and not self.record_no_grad and not torch.is_grad_enabled():
                record = False
            call = _Call(module, name if record else None)
            win.stack.append(call)
            if not record:
                return
            win.calls.append(call)
            for t in _floating_tensors(args):
                reduced = self._reduced(win, t)
                call.in_norms.append(_Reduced(reduced) if reduced is not None else S.l2(t))
                call.in_numel += t.numel()
        except StopRun:
            raise
        except Exception as e:  # noqa: BLE001
            self._note_error(f"entering {type(module).__name__}", e)

    def _post(self, module: nn.Module, args: tuple, output: Any) -> None:
        win = self._win
        if win is None or not win.stack or _in_backward():
            return
        try:
            call = None
            for i in range(len(win.stack) - 1, -1, -1):
                if win.stack[i].module is module:
                    call = win.stack[i]
                    del win.stack[i:]
                    break
            if call is None or call.name is None or output is None:
                return
            call.finish = win.finished
            win.finished += 1
            sat = _saturation_of(module)
            for t in _floating_tensors(output):
                call.out.append(self._out_moments(win, t, sat))
                if self.gradients and t.requires_grad and torch.is_grad_enabled():
                    self._grad_hook(win, t, call.name)
        except Exception as e:  # noqa: BLE001
            self._note_error(f"leaving {type(module).__name__}", e)

    @staticmethod
    def _reduced(win: _Window, t: torch.Tensor) -> torch.Tensor | list[float] | None:
        """The exact moment vector of this version of ``t`` if an earlier call of the step output it."""
        for ref, key, vec in win.memo:
            if key[0] == id(t) and key[1] == t._version and ref() is t:
                exact = not isinstance(vec, list) or not vec[S._I["sampled"]]
                return vec if exact else None
        return None

    def _out_moments(self, win: _Window, t: torch.Tensor, sat: tuple[float, float] | None) -> torch.Tensor | list[float]:
        # A container usually returns its last child's output: reduce each tensor version once.
        key = (id(t), t._version, sat)
        for ref, k, vec in win.memo:
            if k == key and ref() is t:
                return vec
        vec = S.moments(t, sat, self.sample)
        win.memo.append((weakref.ref(t), key, vec))  # a weak reference: outputs are not kept alive
        return vec

    def _grad_hook(self, win: _Window, t: torch.Tensor, name: str) -> None:
        key = (id(t), t._version)
        entry = win.grad_targets.get(key)
        if entry is not None and entry[0]() is t:
            if name not in entry[1]:
                entry[1].append(name)
            return
        names = [name]
        win.grad_targets[key] = (weakref.ref(t), names)

        def hook(g: torch.Tensor, names=names, win=win) -> None:
            if not win.open or g is None:
                return
            try:
                vec = S.moments(g, None, self.sample)
                seq = win.grad_seq
                win.grad_seq += 1
                for n in names:
                    win.grads.setdefault(n, []).append((seq, vec))
            except Exception as e:  # noqa: BLE001
                self._note_error("reducing a gradient", e)

        win.tensor_hooks.append(t.register_hook(hook))

    # -- hooks: forward-mode steps -------------------------------------------------------------
    def _is_root(self, module: nn.Module) -> bool:
        return any(module is r for r in self.roots)

    def _root_pre(self, module: nn.Module, args: tuple) -> None:
        """The root's own pre-hook (forward-mode steps): runs after the global pre-hooks, and is the
        only hook left when no sampled step is open."""
        if self._root_call_handled:
            self._root_call_handled = False
            return
        if not self._is_root(module) or (self._win is not None and self._win.stack) or _in_backward():
            return  # a nested call of the root (or a former root): not a new step
        try:
            if self._root_calls > 0:
                self._end_step()
            self._root_calls += 1
            if self._win is not None:
                # The window just opened: the global pre-hooks of this call did not run; record it here.
                self._pre(module, args, advance=False)
                self._root_call_handled = False
        except StopRun:
            raise
        except Exception as e:  # noqa: BLE001
            self._note_error("starting a step", e)

    # -- hooks: optimizers --------------------------------------------------------------------
    def _opt_pre(self, opt: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        if self._primary_opt is None:
            self._primary_opt = weakref.ref(opt)
        win = self._win
        if win is None or not self.params:
            return
        try:
            named = []
            for group in opt.param_groups:
                for p in group["params"]:
                    entry = self._param_names.get(id(p))
                    if entry is None or id(p) in win.params_seen or p.layout != torch.strided:
                        continue
                    win.params_seen.add(id(p))
                    named.append((entry[0], p))
            win.updates.before_step(named)
        except Exception as e:  # noqa: BLE001
            self._note_error("reading parameters before optimizer.step()", e)

    def _opt_post(self, opt: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        win = self._win
        if win is not None and win.updates.before:
            try:
                win.updates.after_step([p for group in opt.param_groups for p in group["params"]])
            except Exception as e:  # noqa: BLE001
                self._note_error("measuring parameter updates", e)
        if self.step_on != "optimizer":
            return
        primary = self._primary_opt() if self._primary_opt is not None else None
        if primary is not None and primary is not opt:
            return
        self._end_step()

    # -- turning a window into host values ------------------------------------------------------
    def _materialize(self, win: _Window) -> StepRecord:
        vecs: list[torch.Tensor | list[float]] = []
        scalars: list[torch.Tensor | float] = []

        def vslot(v: torch.Tensor | list[float]) -> int:
            vecs.append(v)
            return len(vecs) - 1

        def sslot(v: torch.Tensor | float) -> int:
            scalars.append(v)
            return len(scalars) - 1

        def norm_slot(n: torch.Tensor | float | _Reduced) -> tuple[bool, int]:
            return (True, vslot(n.vec)) if isinstance(n, _Reduced) else (False, sslot(n))

        call_slots = [([vslot(v) for v in c.out], [norm_slot(n) for n in c.in_norms]) for c in win.calls]
        grad_slots = {n: [(seq, vslot(v)) for seq, v in lst] for n, lst in win.grads.items()}
        pnorm_slots = {n: (k, sslot(w), sslot(g) if g is not None else None) for n, (k, w, g) in win.updates.norms.items()}
        upd_slots = {n: (sslot(d), sslot(b)) for n, (d, b) in win.updates.updates.items()}
        host_v = S.to_host(vecs)
        host_s = scalars_to_host(scalars)

        def norm(slot: tuple[bool, int]) -> float:
            from_vec, i = slot
            return S.l2_from_moments(host_v[i]) if from_vec else host_s[i]

        rec = StepRecord(step=win.step)
        # Start order of first calls: the observed execution order.
        seen: list[str] = []
        finish_order = sorted(range(len(win.calls)), key=lambda i: win.calls[i].finish)
        for c, (out_idx, in_idx) in zip(win.calls, call_slots):
            name = c.name
            assert name is not None
            if c.finish < 0:
                continue  # never returned (an exception inside it)
            ms = rec.modules.get(name)
            if ms is None:
                ms = rec.modules[name] = ModuleStep(type=type(c.module).__name__)
                seen.append(name)
                self._types.setdefault(name, ms.type)
                cls = type(c.module)
                self._class_paths.setdefault(name, f"{cls.__module__}:{cls.__qualname__}")
            ms.calls += 1
            ms.saturation = ms.saturation or _saturation_of(c.module) is not None
            out = S.merge_all(host_v[i] for i in out_idx)
            if out is not None:
                ms.act = out if ms.act is None else S.merge(ms.act, out)
            norms = [norm(j) for j in in_idx]
            ms.in_sq += sum(x * x for x in norms if math.isfinite(x))
            ms.in_numel += c.in_numel
            if any(not math.isfinite(x) for x in norms):
                ms.in_nonfinite = True
        for i in finish_order:
            c = win.calls[i]
            if c.finish < 0:
                continue
            out_idx, in_idx = call_slots[i]
            if any(host_v[j][S._I["nan"]] + host_v[j][S._I["inf"]] > 0 for j in out_idx):
                in_bad = any(not math.isfinite(norm(j)) for j in in_idx)
                rec.nonfinite.append((c.name, in_bad))  # type: ignore[arg-type]
        grad_events: list[tuple[int, str, bool]] = []
        for name, lst in grad_slots.items():
            if name not in rec.modules:
                continue
            merged = S.merge_all(host_v[i] for _, i in lst)
            rec.modules[name].grad = merged
            for seq, i in lst:
                v = host_v[i]
                grad_events.append((seq, name, v[S._I["nan"]] + v[S._I["inf"]] > 0))
        for _, name, bad in sorted(grad_events):
            if bad and name not in rec.nonfinite_grads:
                rec.nonfinite_grads.append(name)
        owners = dict(self._param_names.values())
        for pname, (numel, wi, gi) in pnorm_slots.items():
            wn = host_s[wi]
            gn = host_s[gi] if gi is not None else None
            ps = rec.params[pname] = ParamStep(module=owners.get(pname, ""), numel=numel, weight_norm=wn, grad_norm=gn)
            if pname in upd_slots:
                dn, bn = (host_s[j] for j in upd_slots[pname])
                ps.update_ratio = dn / bn if bn > 0 and math.isfinite(dn) and math.isfinite(bn) else None
        merge_observed(self._order, seen)
        return rec
