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
  in memory, so the copy reads few cache lines), and counts the rows of each weight whose gradient
  is exactly zero (units no gradient reaches);
- during the forward pass, a torch-function mode sees every softmax (and the attention weights of
  ``scaled_dot_product_attention``) and gives its row statistics to the module that computed it
  (:mod:`modulelens.stats.softmax`).

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

import os
import sys
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn as nn
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from modulelens.stats import stats as S
from modulelens.stats.compiled import force_eager, in_backward
from modulelens.stats.fused import unavailable
from modulelens.stats.naming import ModuleNames
from modulelens.stats.order import execution_order, merge_observed
from modulelens.stats.records import StatsRun, StepRecord
from modulelens.stats.schema import NanOrigin, StatsFinding
from modulelens.stats.series import DEFAULT_EMA
from modulelens.stats.softmax import ObserverSlot, quiet
from modulelens.stats.updates import HostState
from modulelens.stats.window import Call, Reduced, Window, floating_tensors, materialize, saturation_of
from modulelens.wrappers import is_wrapper

DEFAULT_EVERY = 10  # statistics on steps 0, 10, 20, ...
StepOn = Literal["optimizer", "forward", "manual"]


class StopRun(BaseException):
    """Raised out of the user's ``optimizer.step()`` once the requested number of steps ran.
    A BaseException so that a user's ``except Exception`` does not swallow it."""


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
    element. ``None`` or ``0``: everything exact. On the CPU, contiguous float32/float64/bfloat16
    tensors are read in one pass by a small C helper (:mod:`modulelens.stats.fused`) and everything is
    exact whatever ``sample`` says. ``softmax``: gather softmax/attention statistics.
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
        softmax: bool = True,
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
        self.softmax = softmax
        self.current_step = 0
        self.steps_seen = 0
        self.records: list[StepRecord] = []
        self.notes: list[str] = []
        self.names = ModuleNames(model, self.notes)
        self.eager_sampled_steps = 0  # sampled steps run with compiled code forced eager
        self.artifact: Any = None
        self.findings: list[StatsFinding] = []
        self.deadline: float | None = None  # time.monotonic() after which the next step ends the run
        self._restore_stance: Callable[[], None] | None = None
        self._types: dict[str, str] = {}
        self._class_paths: dict[str, str] = {}
        self._order: list[str] = []
        self._zero_rows: dict[str, torch.Tensor] = {}  # weight -> its rows with a zero gradient on the last sampled step
        self._host_params = HostState()  # how the C helper reads each CPU parameter, and its copy buffer
        self._win: Window | None = None
        self._slot = ObserverSlot(self._record_softmax, self._note_once, enabled=softmax)
        self._module_hooks: list[Any] = []
        self._opt_hooks: list[Any] = []
        self._root_hooks: list[Any] = []
        self._primary_opt: weakref.ref | None = None
        self._root_calls = 0
        self._root_call_handled = False
        self._errors = 0
        self._active = False
        self._run: StatsRun | None = None

    @property
    def roots(self) -> list[nn.Module]:
        return self.names.roots

    @property
    def compiled(self) -> bool:
        return self.names.compiled

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
            self._run = StatsRun(
                records=self.records, order=order, order_source=source, types=dict(self._types),
                class_paths=dict(self._class_paths), param_shapes=dict(self.names.param_shapes), every=self.every,
                steps_seen=self.steps_seen, step_on=self.step_on, notes=self._final_notes(fx_note),
                compiled=self.compiled, sample=self.sample,
            )
        return self._run

    def _final_notes(self, fx_note: str | None) -> list[str]:
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
        why = unavailable()
        if why:
            notes.append(f"statistics of CPU tensors were computed with PyTorch operators, not in one pass: {why}")
        return notes

    def save(self, name: str | None = None, repo: str | os.PathLike[str] | None = None, *,
             run: StatsRun | None = None, nan_origin: NanOrigin | None = None, **meta: Any):
        """Store the run (this collector's, or ``run``, e.g. merged over ranks) as a ``stats`` artifact
        (series, findings, report); returns the artifact. ``nan_origin``: where NaN/Inf was born,
        from a rerun (:class:`~modulelens.stats.schema.NanOrigin`)."""
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
            nan_origin=nan_origin,
        )
        return self.artifact

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
        self._win = Window(step=self.current_step)
        if self._restore_stance is None:
            self._restore_stance = force_eager()
        self._set_module_hooks(True)

    def _close_window(self, keep: bool = True) -> None:
        win = self._win
        self._win = None
        if win is None:
            return
        win.open = False
        self._slot.drop(False)
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
                rec = materialize(win, dict(self.names.param_names.values()))
            except Exception as e:  # noqa: BLE001 - statistics must never break the user's run
                self._note_error("finishing a sampled step", e)
                return
            for name, ms in rec.modules.items():
                self._types.setdefault(name, ms.type)
                self._class_paths.setdefault(name, ms.class_path)
            merge_observed(self._order, list(rec.modules))
            self.records.append(rec)

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

    def _note_once(self, note: str) -> None:
        if note not in self.notes:
            self.notes.append(note)

    # -- softmax ---------------------------------------------------------------------------------
    def _record_softmax(self, source: str, vec: Any) -> None:
        win = self._win
        name = win.innermost() if win is not None else None
        if name is not None:
            win.softmax.setdefault(name, []).append((source, vec))  # type: ignore[union-attr]
            win.on_device = win.on_device or type(vec) is not list  # type: ignore[union-attr]

    # -- hooks: modules -----------------------------------------------------------------------
    def _pre(self, module: nn.Module, args: tuple, advance: bool = True) -> None:
        win = self._win
        if win is None or in_backward():
            return
        push = self._slot.suspend()
        try:
            parent = win.stack[-1] if win.stack else None
            if self.step_on == "forward" and parent is None and self.names.is_root(module):
                # A top-level call of the root: a new step begins (forward-mode steps).
                self._root_call_handled = True  # the root's own pre-hook runs next: nothing left to do
                if advance and self._root_calls > 0:
                    if push:
                        self._slot.drop(True)
                        push = False
                    self._end_step()
                    win = self._win
                    if win is None:
                        return
                self._root_calls += 1
            name = self.names.lookup(module)
            if name is None and parent is None:
                if self.names.adopt_root(module):
                    if self.step_on == "forward":
                        self._watch_root(module)
                        self._root_calls = 1
                    name = self.names.lookup(module)
            elif name is None and parent is not None and parent.name is not None:
                name = self.names.name_unregistered(module, parent.name)
            record = name is not None and not is_wrapper(module)
            if record and not self.record_no_grad and not torch.is_grad_enabled():
                record = False
            call = Call(module, name if record else None)
            win.stack.append(call)
            if not record:
                return
            push = self._slot.start() or push
            if push and quiet(module):  # its operators need not pass through the observer
                call.quiet = True
                push = False
            win.calls.append(call)
            for t in floating_tensors(args):
                reduced = _reduced(win, t)
                norm = Reduced(reduced) if reduced is not None else S.l2(t)
                call.in_norms.append(norm)
                win.on_device = win.on_device or not isinstance(norm, (float, Reduced))
                call.in_numel += t.numel()
        except StopRun:
            raise
        except Exception as e:  # noqa: BLE001
            self._note_error(f"entering {type(module).__name__}", e)
        finally:
            if push:
                self._slot.resume()

    def _post(self, module: nn.Module, args: tuple, output: Any) -> None:
        win = self._win
        if win is None or not win.stack or in_backward():
            return
        push = self._slot.suspend()
        try:
            call = None
            for i in range(len(win.stack) - 1, -1, -1):
                if win.stack[i].module is module:
                    call = win.stack[i]
                    del win.stack[i:]
                    break
            off = call is not None and call.quiet  # the observer was kept off during the call
            if not win.stack:  # the forward pass is over
                self._slot.drop(push or off)
                push = False
            elif off:
                push = True  # the quiet call is over: the observer goes back
            if call is None or call.name is None or output is None:
                return
            call.finish = win.finished
            win.finished += 1
            sat = saturation_of(module)
            call.saturating = sat is not None
            for t in floating_tensors(output):
                vec = self._out_moments(win, t, sat)
                call.out.append(vec)
                win.on_device = win.on_device or type(vec) is not list
                if self.gradients and t.requires_grad and torch.is_grad_enabled():
                    self._grad_hook(win, t, call.name)
        except Exception as e:  # noqa: BLE001
            self._note_error(f"leaving {type(module).__name__}", e)
        finally:
            if push:
                self._slot.resume()

    def _out_moments(self, win: Window, t: torch.Tensor, sat: tuple[float, float] | None) -> torch.Tensor | list[float]:
        # A container usually returns its last child's output: reduce each tensor version once.
        seen = win.memo.get(id(t))
        version = t._version
        if seen is not None and seen[0]() is t and seen[1] == version and seen[2] == sat:
            return seen[3]
        vec = S.moments(t, sat, self.sample)
        win.memo[id(t)] = (weakref.ref(t), version, sat, vec)  # a weak reference: outputs are not kept alive
        return vec

    def _grad_hook(self, win: Window, t: torch.Tensor, name: str) -> None:
        key = (id(t), t._version)
        entry = win.grad_targets.get(key)
        if entry is not None and entry[0]() is t:
            if name not in entry[1]:
                entry[1].append(name)
            return
        names = [name]
        win.grad_targets[key] = (weakref.ref(t), names)
        node = t.grad_fn
        index = t.output_nr if node is not None else 0

        # A pre-hook of the node that made t (half the cost of a tensor hook): it sees the gradient
        # w.r.t. each output of the node; t is output ``index``. Like a tensor hook registered now,
        # it sees the gradient w.r.t. this version of t, also when t is later modified in place.
        def pre(grads: tuple, names=names, win=win, index=index) -> None:
            g = grads[index] if index < len(grads) else None
            if not win.open or g is None:
                return
            try:
                vec = S.moments(g, None, self.sample)
                seq = win.grad_seq
                win.grad_seq += 1
                for n in names:
                    win.grads.setdefault(n, []).append((seq, vec))
                win.on_device = win.on_device or type(vec) is not list
            except Exception as e:  # noqa: BLE001
                self._note_error("reducing a gradient", e)

        if node is None:  # a leaf: a hook on the tensor itself
            win.tensor_hooks.append(t.register_hook(lambda g, pre=pre: pre((g,))))
        else:
            win.tensor_hooks.append(node.register_prehook(pre))

    # -- hooks: forward-mode steps -------------------------------------------------------------
    def _root_pre(self, module: nn.Module, args: tuple) -> None:
        """The root's own pre-hook (forward-mode steps): runs after the global pre-hooks, and is the
        only hook left when no sampled step is open."""
        if self._root_call_handled:
            self._root_call_handled = False
            return
        if not self.names.is_root(module) or (self._win is not None and self._win.stack) or in_backward():
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
                    entry = self.names.param_names.get(id(p))
                    if entry is None or id(p) in win.params_seen or p.layout != torch.strided:
                        continue
                    win.params_seen.add(id(p))
                    named.append((entry[0], p))
            win.updates.before_step(named, self._zero_rows, {n for n, p in named if id(p) in self.names.tables},
                                    self._host_params)
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


def _reduced(win: Window, t: torch.Tensor) -> torch.Tensor | list[float] | None:
    """The exact moment vector of this version of ``t`` if an earlier call of the step output it."""
    seen = win.memo.get(id(t))
    if seen is None or seen[0]() is not t or seen[1] != t._version:
        return None
    vec = seen[3]
    return vec if not isinstance(vec, list) or not vec[S.SAMPLED] else None
