"""Statistics over a script in a worker process: both sides of the protocol.

Caller side (:func:`gather_script_stats`): run ``python -m modulelens.stats.worker REQUEST.json
OUT_DIR`` on a :class:`StatsWorkerRequest` (under torchrun with ``nproc`` > 1) and read rank 0's
:class:`StatsWorkerResult`, with the shared launcher of :mod:`modulelens.workers`.

Worker side (:func:`run`): the user's script runs here unmodified, as ``__main__``, with a
:class:`~modulelens.stats.collector.StatsCollector` installed (root model found at its first
top-level call). The run ends when the script does, or after ``steps`` optimizer steps
(:class:`~modulelens.stats.collector.StopRun` out of ``optimizer.step()``). The worker stores the
statistics in the repository and answers with their reference.

When a sampled step held NaN/Inf and the sampled steps cannot say where they were born (an
unsampled step before it, or weights already spread by an optimizer step), the worker first reruns
the script in a second worker (``mode="nan_origin"``, :func:`find_nan_origin`) with a
:class:`~modulelens.stats.sentinel.NonfiniteSentinel` up to that step, bounded in time, and stores
the origin with the statistics. ``nan_rerun=False`` turns it off.
"""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from modulelens.errors import CaptureFailed, ModuleLensError
from modulelens.stats.collector import DEFAULT_EVERY
from modulelens.stats.records import StepRecord
from modulelens.stats.schema import NanOrigin
from modulelens.stats.series import DEFAULT_EMA
from modulelens.stats.stats import DEFAULT_SAMPLE
from modulelens.workers import WorkerResult, distributed_rank, launch_worker, worker_main


class StatsWorkerRequest(BaseModel):
    """What the worker runs and how it gathers (the collector's settings; defaults are the collector's)."""

    script: str = Field(description="absolute path of the training script")
    script_args: list[str] = Field(default_factory=list)
    name: str = Field(description="name of the stats artifact to store")
    repo: str = Field(description="repository root")
    workdir: str = Field(description="absolute folder the script runs in (its working directory, first on sys.path): "
                         "the call's project folder; recorded as the statistics' source cwd")
    every: int = DEFAULT_EVERY
    steps: int | None = None
    step_on: Literal["optimizer", "forward"] = "optimizer"
    eager: bool = True
    params: bool = True
    fx: bool = True
    ema: float = DEFAULT_EMA
    plots: bool = True
    sample: int = DEFAULT_SAMPLE
    thresholds: dict[str, float] = Field(default_factory=dict)
    stop_at: float | None = Field(None, description="time.time() at which to end the run at the next step boundary")
    nproc: int = Field(1, ge=1, description="processes under torchrun; rank 0 merges every rank's statistics")
    out_dir: str = Field("", description="the worker's folder (per-rank records under torchrun); the worker sets it "
                         "from its command line")
    nan_rerun: bool = Field(True, description="rerun the script to find where NaN/Inf is born when a sampled step "
                            "held them")
    mode: Literal["stats", "nan_origin"] = Field("stats", description="nan_origin: the rerun (checks every step up to "
                                                 "stop_step, stores nothing)")
    stop_step: int = Field(0, ge=0, description="nan_origin: the last step to check")


class StatsWorkerResult(WorkerResult):
    """The stored run's reference (empty on ranks other than 0, which hand their statistics over),
    or the answer of a NaN/Inf rerun."""

    ref: str = ""
    steps_seen: int = 0
    nan_origin: NanOrigin | None = None


RANK_WAIT_S = 300.0  # how long rank 0 waits for the other ranks' statistics after its own run ended
RERUN_MIN_S = 60.0  # the NaN/Inf rerun gets twice the first run's time plus this, within the caller's limit
RERUN_MAX_S = 900.0

def gather_script_stats(request: StatsWorkerRequest, *, timeout: float) -> tuple[StatsWorkerResult, str]:
    """Caller side: run the statistics worker on ``request`` (its output relayed to stderr, never
    to stdout, which may be the MCP wire); returns its result and the last lines the script printed. A failed run
    raises its ModuleLensError."""
    timeout_error = CaptureFailed(
        f"the script ran past [--timeout] ({timeout:.0f} s) without reaching an optimizer step, and was "
        "stopped", "raise [--timeout], or check that the script trains (optimizer.step()) early",
    )
    run = launch_worker("modulelens.stats.worker", request, StatsWorkerResult, what="statistics", timeout=timeout,
                        timeout_error=timeout_error, cwd=request.workdir, nproc=request.nproc)
    return run.result(0), run.output_tail


def first_nonfinite(records: list[StepRecord]) -> StepRecord | None:
    """The first sampled step that held NaN/Inf (in outputs or gradients), or None."""
    return next((r for r in records if r.nonfinite or r.nonfinite_grads), None)


def origin_is_known(records: list[StepRecord], rec: StepRecord) -> bool:
    """True when the sampled steps alone say where NaN/Inf was born: the step before ``rec`` was
    sampled (or there is none), and a module's output turned NaN/Inf there from finite inputs
    while no other module's weights held any (nothing spread them)."""
    if rec.step > 0 and not any(r.step == rec.step - 1 for r in records):
        return False
    origin = next((m for m, bad_input in rec.nonfinite if not bad_input), None)
    if origin is None:
        return False
    bad_weights = [p for p in rec.params.values() if not math.isfinite(p.weight_norm)]
    return all(p.module == origin for p in bad_weights)


def find_nan_origin(request: StatsWorkerRequest, stop_step: int, timeout: float) -> NanOrigin:
    """Rerun the script of ``request`` with a NaN/Inf check on every step up to ``stop_step``
    (bounded by ``timeout`` seconds); the origin, or why there is none."""
    rerun = request.model_copy(update={"mode": "nan_origin", "stop_step": stop_step, "nproc": 1,
                                       "stop_at": time.time() + timeout})
    started = time.monotonic()
    try:
        result, _ = gather_script_stats(rerun, timeout=timeout + 30.0)
    except ModuleLensError as e:
        return NanOrigin(found=False, detail=f"the rerun failed: {e.message}", seconds=time.monotonic() - started)
    origin = result.nan_origin or NanOrigin(found=False, detail="the rerun gave no answer")
    return origin.model_copy(update={"seconds": time.monotonic() - started})


def _rerun_budget(request: StatsWorkerRequest, first_run_s: float) -> float:
    left = (request.stop_at - time.time()) if request.stop_at else RERUN_MAX_S
    return max(0.0, min(RERUN_MAX_S, 2 * first_run_s + RERUN_MIN_S, left - 30.0))


def _count_compile_calls() -> list[int]:
    """Wrap ``torch.compile`` to count calls (``nn.Module.compile`` goes through it too)."""
    import torch

    counter = [0]
    original = torch.compile

    def compile(*args: Any, **kwargs: Any) -> Any:  # noqa: A001 - same name as the wrapped function
        counter[0] += 1
        return original(*args, **kwargs)

    compile.__wrapped__ = original  # type: ignore[attr-defined]
    compile.__doc__ = original.__doc__
    torch.compile = compile  # type: ignore[assignment]
    return counter


def _disable_dynamo() -> None:
    os.environ["TORCHDYNAMO_DISABLE"] = "1"  # for processes the script starts
    try:
        import torch._dynamo

        torch._dynamo.config.disable = True
    except Exception:  # noqa: BLE001 - older/stripped builds: the env variable still applies
        pass


def run_sentinel(request: StatsWorkerRequest) -> StatsWorkerResult:
    """Worker side of the NaN/Inf rerun: run the script with a sentinel (nothing is stored)."""
    from modulelens.capture import run_user_file
    from modulelens.stats.collector import StopRun
    from modulelens.stats.sentinel import NonfiniteSentinel

    if request.eager:
        _disable_dynamo()
    deadline = time.monotonic() + (request.stop_at - time.time()) if request.stop_at else None
    sentinel = NonfiniteSentinel(request.stop_step, deadline, request.step_on).start()
    try:
        error = run_user_file(Path(request.script).resolve(), request.script_args, stop=StopRun)
    finally:
        sentinel.stop()
    why = f"the script ended ({type(error).__name__}: {error}) before the step" if error is not None else ""
    return StatsWorkerResult(steps_seen=sentinel.step, nan_origin=sentinel.result(why))


def run(request: StatsWorkerRequest) -> StatsWorkerResult:
    """Worker side: run the script with a collector and store the statistics."""
    from modulelens.capture import run_user_file, script_error
    from modulelens.stats.collector import StatsCollector, StopRun

    if request.mode == "nan_origin":
        return run_sentinel(request)
    started = time.monotonic()
    if request.eager:
        _disable_dynamo()
    else:
        import torch._dynamo  # noqa: F401 - loaded now, so that step 0 can run compiled code eagerly too
    compiles = _count_compile_calls()
    script = Path(request.script).resolve()
    collector = StatsCollector(
        every=request.every, max_steps=request.steps, step_on=request.step_on, params=request.params, fx=request.fx,
        ema=request.ema, plots=request.plots, thresholds=request.thresholds, sample=request.sample or None,
    )
    if request.stop_at:  # end at a step boundary before the caller's hard limit, keeping the statistics
        collector.deadline = time.monotonic() + (request.stop_at - time.time())
    collector.start()
    try:
        error = run_user_file(script, request.script_args, stop=StopRun)
    finally:
        collector.stop()
    notes: list[str] = []
    if compiles[0]:
        if request.eager:
            notes.append(
                f"the script called torch.compile {compiles[0]} time(s); it ran in eager mode instead (torch.compile "
                "disabled) because module hooks do not run inside compiled code: the statistics describe the same "
                "model computed eagerly. Pass --no-eager to keep torch.compile (then its submodules are not observed)."
            )
        else:
            notes.append(
                f"the script called torch.compile {compiles[0]} time(s) and --no-eager kept it for the steps "
                "without statistics; sampled steps ran eagerly (see the other note)."
            )
    if not collector.records:
        if error is not None:
            raise script_error(error, script, "a training step was sampled")
        raise CaptureFailed(
            "the run ended before any module of the model was called on a sampled step",
            "check that the script trains a model (its forward must run with gradients enabled, or use "
            "[--step-on forward] for loops without an optimizer)",
        )
    if error is not None:
        where = script_error(error, script).message
        notes.append(f"the script stopped early: {where}; statistics cover the steps before it")
    collector.notes.extend(notes)
    merged = None
    rank = distributed_rank()
    if rank is not None and request.nproc > 1:
        from modulelens.stats.ranks import merge_ranks, read_ranks, write_rank

        world = int(os.environ["WORLD_SIZE"])
        if rank != 0:
            write_rank(Path(request.out_dir), rank, collector.finish())
            return StatsWorkerResult(steps_seen=collector.steps_seen)
        merged = merge_ranks([collector.finish(), *read_ranks(Path(request.out_dir), range(1, world), RANK_WAIT_S)])
    origin = None
    bad = first_nonfinite(collector.records)
    if bad is not None and not origin_is_known(collector.records, bad):
        if not request.nan_rerun:
            collector.notes.append("NaN/Inf appeared; the rerun that finds where they are born is off (--no-nan-rerun)")
        elif request.nproc > 1:
            collector.notes.append("NaN/Inf appeared; the rerun that finds where they are born is not made under torchrun")
        else:
            budget = _rerun_budget(request, time.monotonic() - started)
            origin = (find_nan_origin(request, bad.step, budget) if budget > 5 else
                      NanOrigin(found=False, detail="no time was left for the rerun within --timeout"))
    art = collector.save(
        request.name, request.repo, run=merged, nan_origin=origin,
        kind="script", script=str(script), argv=request.script_args, cwd=request.workdir, every=request.every,
        steps=request.steps,
    )
    return StatsWorkerResult(ref=art.ref, steps_seen=collector.steps_seen)


def main(argv: list[str]) -> None:
    def run_here(request: StatsWorkerRequest) -> StatsWorkerResult:
        return run(request.model_copy(update={"out_dir": argv[1]}))

    worker_main(run_here, argv, "statistics", StatsWorkerRequest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
