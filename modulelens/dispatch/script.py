"""Run an unmodified script with a pack applied, in a worker process, and record its steps.

The parent (:func:`run_script`) starts ``python -m modulelens.dispatch.worker REQUEST OUT_DIR`` with
a :class:`ScriptRunRequest` (:func:`~modulelens.workers.launch_worker`); the worker runs the script as ``__main__`` (as capture does) inside
:func:`~modulelens.dispatch.api.use_pack` when a pack is given, and writes a
:class:`ScriptRunOutcome`: the exit code, the dispatch report, and what the script's steps did:

* a *step* ends at each optimizer step (``torch.optim`` global step hook); a step's time is the
  interval since the previous step ended (the first from the first model forward). A script
  that never steps an optimizer (inference) counts each top-level model forward as a step.
* its *outputs* are the scalar tensors ``.backward()`` is called on (the losses), or, without
  backward calls, the sum of each top-level forward's first output tensor.

The top-level model is the first module called that is not inside a model seen before.

With ``toggle`` (``run --compare``), the pack is switched on and off between steps
(:class:`ToggleSchedule`): the first step with it and the second without (warm-up: builds, caches),
then pairs of steps in alternating order (on/off, off/on, ...), each step recorded with its state,
so that with and without are timed in one process, interleaved, and the step ratio comes with an
interval (:func:`step_ratio`).
"""

from __future__ import annotations

import statistics
import sys
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, Field

from modulelens.dispatch.runtime import DEFAULT_MECHANISM, DispatchReport, Mechanism
from modulelens.errors import ModuleLensError
from modulelens.workers import WorkerResult, launch_worker


class ScriptRunRequest(BaseModel):
    script: str
    script_args: list[str] = Field(default_factory=list)
    workdir: str = Field(description="Absolute folder the script runs in (its working directory, first on sys.path): "
                         "the call's project folder.")
    pack: str | None = Field(None, description="None: run without a pack (the baseline).")
    toggle: bool = Field(False, description="Switch the pack on and off between steps (ToggleSchedule).")
    allow_env_mismatch: bool = False
    expect_sha256: str | None = None
    mechanism: Mechanism = DEFAULT_MECHANISM


class ScriptRunOutcome(WorkerResult):
    exit_code: int = 0
    script_error: str | None = Field(None, description="How the script ended, when not normally.")
    report: DispatchReport | None = None
    step_seconds: list[float] = Field(default_factory=list)
    step_pack_on: list[bool] = Field(default_factory=list, description="With toggle: whether each step ran with the pack.")
    step_kind: str = Field("optimizer step", description="optimizer step, or model forward for scripts that never step.")
    outputs: list[float] = Field(default_factory=list)
    output_kind: str = Field("loss", description="loss (scalars .backward() was called on), or forward output sum.")


class ToggleSchedule:
    """Which steps run with the pack when it is toggled: step 0 with (warm-up), step 1 without
    (warm-up), then round ``r`` = steps ``2 + 2r`` and ``3 + 2r``: on then off for even ``r``, off
    then on for odd ``r`` (ABBA over pairs of steps)."""

    WARMUP = 2

    @staticmethod
    def on(step: int) -> bool:
        if step < ToggleSchedule.WARMUP:
            return step == 0
        r, k = divmod(step - ToggleSchedule.WARMUP, 2)
        return (k == 0) == (r % 2 == 0)


def step_rounds(seconds: list[float], on: list[bool]) -> tuple[list[float], list[float]]:
    """(seconds without the pack, seconds with it), one pair per complete round of the
    :class:`ToggleSchedule` (warm-up steps left out)."""
    without, with_ = [], []
    for first in range(ToggleSchedule.WARMUP, len(seconds) - 1, 2):
        pair = {on[first]: seconds[first], on[first + 1]: seconds[first + 1]}
        if len(pair) == 2:
            without.append(pair[False])
            with_.append(pair[True])
    return without, with_


class StepRecorder:
    """Records step times and outputs of a script run (see the module docstring); with a
    ``switch``, turns the pack on and off between steps (:class:`ToggleSchedule`)."""

    def __init__(self, switch: Any = None) -> None:
        self.switch = switch
        self.pack_on = True
        self.step_on: list[bool] = []
        self.forward_on: list[bool] = []
        self.seen: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
        self.roots: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
        self.start: float | None = None
        self.last: float | None = None
        self.steps: list[float] = []
        self.forward_times: list[float] = []
        self.losses: list[float] = []
        self.forward_sums: list[float] = []
        self._handles: list[Any] = []
        self._backward: Any = None
        self._depth = 0
        self._t0 = 0.0

    def install(self) -> StepRecorder:
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self._handles = [register_module_forward_pre_hook(self._pre), register_module_forward_hook(self._post),
                         register_optimizer_step_post_hook(self._stepped)]
        original = torch.Tensor.backward
        recorder = self

        def backward(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if tensor.numel() == 1:
                recorder.losses.append(float(tensor.detach()))
            return original(tensor, *args, **kwargs)

        self._backward = original
        torch.Tensor.backward = backward  # type: ignore[method-assign]
        return self

    def uninstall(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        if self._backward is not None:
            torch.Tensor.backward = self._backward  # type: ignore[method-assign]
            self._backward = None

    def _pre(self, module: torch.nn.Module, args: Any) -> None:
        if module not in self.seen:
            for _, sub in module.named_modules():
                self.seen.add(sub)
            self.roots.add(module)
        if module in self.roots:
            self._depth += 1
            if self._depth == 1:
                if self.forward_times and not self.steps:  # no optimizer step yet: forwards are the steps
                    self._set(ToggleSchedule.on(len(self.forward_times)))
                self._t0 = time.perf_counter()
                if self.start is None:
                    self.start = self._t0

    def _post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if module in self.roots and self._depth > 0:
            self._depth -= 1
            if self._depth == 0:
                self.forward_times.append(time.perf_counter() - self._t0)
                self.forward_on.append(self.pack_on)
                first = _first_tensor(output)
                if first is not None and not self.losses:
                    self.forward_sums.append(float(first.detach().double().sum()))

    def _stepped(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.step_on.append(self.pack_on)
        now = time.perf_counter()
        begin = self.last if self.last is not None else (self.start if self.start is not None else now)
        self.steps.append(now - begin)
        self._set(ToggleSchedule.on(len(self.steps)))
        self.last = time.perf_counter()  # the switch itself is not part of the next step

    def _set(self, on: bool) -> None:
        if self.switch is not None and on != self.pack_on:
            self.switch(on)
            self.pack_on = on

    def fill(self, outcome: ScriptRunOutcome) -> None:
        if self.steps:
            outcome.step_seconds, outcome.step_kind, outcome.step_pack_on = self.steps, "optimizer step", self.step_on
        else:
            outcome.step_seconds, outcome.step_kind = self.forward_times, "model forward"
            outcome.step_pack_on = self.forward_on
        if self.losses:
            outcome.outputs, outcome.output_kind = self.losses, "loss"
        else:
            outcome.outputs, outcome.output_kind = self.forward_sums, "forward output sum"


def _first_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (list, tuple)):
        for v in value:
            t = _first_tensor(v)
            if t is not None:
                return t
    if isinstance(value, dict):
        return _first_tensor(list(value.values()))
    return None


class _NeverRaised(BaseException):
    pass


def run_in_worker(request: ScriptRunRequest) -> ScriptRunOutcome:
    """The worker's body: run the script (with the pack when given) and record it."""
    from modulelens.capture import run_user_file
    from modulelens.dispatch.api import use_pack

    outcome = ScriptRunOutcome()
    script = Path(request.script).resolve()
    pack = None
    if request.pack:
        pack = use_pack(request.pack, allow_env_mismatch=request.allow_env_mismatch,
                        expect_sha256=request.expect_sha256, mechanism=request.mechanism)
    recorder = StepRecorder(pack.runtime.switch if pack is not None and request.toggle else None).install()
    try:
        if pack is not None:
            with pack:
                error = run_user_file(script, request.script_args, stop=_NeverRaised)
        else:
            error = run_user_file(script, request.script_args, stop=_NeverRaised)
    finally:
        recorder.uninstall()
    if error is not None:
        outcome.exit_code = error.code if isinstance(error, SystemExit) and isinstance(error.code, int) else 1
        outcome.script_error = f"{type(error).__name__}: {error}"
    outcome.report = pack.report() if pack is not None else None
    recorder.fill(outcome)
    return outcome


# ------------------------------------------------------------------------------------------------
# Parent side


def run_script(request: ScriptRunRequest, timeout: float, progress: Callable[[str], None] | None = None,
               label: str = "", on_line: Callable[[str], None] | None = None) -> tuple[ScriptRunOutcome, str]:
    """Run the script in a worker process (its output relayed to stderr, each line after ``[label] ``
    when a label is given, and each heard by ``on_line``); returns its outcome and the last lines it
    printed (without the label).
    With a pack, the extensions of its module entries that have no verified build here are built
    first, in their own process, saying so through ``progress`` (stderr by default; see
    :func:`~modulelens.dispatch.builds.prepare_builds`): the script's run only loads builds."""
    if request.pack:
        from modulelens.dispatch.builds import prepare_builds

        prepare_builds(request.pack, progress or (lambda m: print(f"modulelens: {m}", file=sys.stderr, flush=True)))
    run = launch_worker(
        "modulelens.dispatch.worker", request, ScriptRunOutcome, what="run", timeout=timeout, cwd=request.workdir,
        relay_prefix=f"[{label}] " if label else "", on_line=on_line,
        timeout_error=ModuleLensError(f"the script did not finish within {timeout:.0f} s and was stopped",
                                      "raise [--timeout] or run fewer steps"))
    return run.result(), run.output_tail


def typical_step(seconds: list[float]) -> float | None:
    """Median step time, leaving out the first step (warm-up: builds, caches) when there are more."""
    kept = seconds[1:] if len(seconds) > 1 else seconds
    return statistics.median(kept) if kept else None


def outputs_agree(a: list[float], b: list[float], rtol: float, atol: float) -> tuple[bool, float | None]:
    """Whether two runs' outputs agree within ``atol + rtol * |b|`` each; and the largest difference."""
    if len(a) != len(b):
        return False, None
    if not a:
        return True, 0.0
    diffs = [abs(x - y) for x, y in zip(a, b)]
    ok = all(d <= atol + rtol * abs(y) for d, y in zip(diffs, b))
    return ok, max(diffs)
