"""What crosses a validation worker's pipes (modulelens.validation.messages over
modulelens.sandbox.protocol): every task and result kind round-trips as model JSON and comes back
as its own type; a real worker answers a ping; the generic sandbox runs only modulelens code it is
told to run."""

from __future__ import annotations

import math
import os

import pytest
from pydantic import TypeAdapter

from modulelens.validation.report import ValidationReport, ValidationSettings
from modulelens.kernels import KernelSource
from modulelens.timing import Timing
from modulelens.sandbox import protocol
from modulelens.validation.messages import (
    TASKS,
    VALIDATION_WORKER,
    WORKER_MESSAGES,
    CrashedResult,
    InternalErrorResult,
    PingTask,
    PongResult,
    RefusedResult,
    SandboxResult,
    StageReport,
    TimeCandidateTask,
    TimedResult,
    ValidateCardTask,
    ValidatedResult,
)

SRC = KernelSource(backend="cpp", source="int forward();", provider="agent")
TIMING = Timing(median_s=1e-5, p20_s=9e-6, p80_s=2e-5, runs=100, samples=20, warmup=3, timer="t", device="cpu",
                threads=1, cache="warm")


def _through_a_pipe(message, schema):
    r, w = os.pipe()
    try:
        protocol.send(w, message)
        os.close(w)
        w = -1
        got = protocol.receive(r, schema)
        assert protocol.receive(r, schema) is None  # the writer closed: end of stream
        return got
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)


TASK_CASES = [
    ValidateCardTask(repo="/r", candidate=SRC, build_dir="/b", card_id="blk:v1/3", seeds=[0, 1, 2], rtol=1e-4),
    TimeCandidateTask(repo="/r", candidate=SRC, build_dir="/b", card_id="blk:v1/3", device="cpu", warmup=1),
    PingTask(),
]


@pytest.mark.parametrize("task", TASK_CASES, ids=lambda t: t.kind)
def test_tasks_round_trip_as_their_own_type(task):
    got = _through_a_pipe(task, TASKS)
    assert type(got) is type(task) and got == task


def test_validate_task_settings_are_what_is_stored_with_the_report():
    task = TASK_CASES[0]
    assert task.settings == ValidationSettings(card_id="blk:v1/3", seeds=[0, 1, 2], rtol=1e-4)
    assert task.settings.distributions == ["normal", "uniform", "heavy", "special"] and task.settings.time


REPORT = ValidationReport(verdict="custom", correct=True, reason="ok", stage="done", backend="cpp",
                          speedup_vs_eager=1.5, eager=TIMING, candidate=TIMING)
RESULT_CASES = [
    ValidatedResult(report=REPORT, healthy=True),
    TimedResult(timing=TIMING),
    RefusedResult(message="cuda candidates cannot be timed here", hint="use a GPU", healthy=False),
    PongResult(),
    InternalErrorResult(error="KeyError: 'x'", traceback="Traceback ..."),
    CrashedResult(reason="crashed with SIGSEGV", stage="check", stderr_tail="boom"),
]


@pytest.mark.parametrize("result", RESULT_CASES, ids=lambda r: r.kind)
def test_results_round_trip_as_their_own_type(result):
    # a worker sends every kind but "crashed", which only the pool makes
    schema = TypeAdapter(SandboxResult) if isinstance(result, CrashedResult) else WORKER_MESSAGES
    got = _through_a_pipe(result, schema)
    assert type(got) is type(result) and got == result


def test_stage_frames_and_defaults():
    got = _through_a_pipe(StageReport(stage="compile"), WORKER_MESSAGES)
    assert isinstance(got, StageReport) and got.stage == "compile"
    assert not InternalErrorResult(error="e").healthy and not CrashedResult(reason="r").healthy
    assert PongResult().healthy and PongResult().stdout_bytes == 0


def test_non_finite_numbers_survive_the_pipe():
    task = ValidateCardTask(repo="/r", candidate=SRC.model_copy(update={"params": {"eps": math.inf}}), build_dir="/b",
                            card_id="c:v1/0", atol=math.inf)
    got = _through_a_pipe(task, TASKS)
    assert got.atol == math.inf and got.candidate.params["eps"] == math.inf


@pytest.mark.slow
def test_a_worker_answers_a_ping():
    from modulelens.sandbox.pool import SandboxPool

    pool = SandboxPool(VALIDATION_WORKER, memory_limit_mb=4096)
    try:
        result = pool.run(PingTask(), timeout=120)
        assert isinstance(result, PongResult) and result.healthy and result.stdout_bytes == 0
        assert pool.run(PingTask(), timeout=120) == result and pool.started == 1  # the worker was reused
    finally:
        pool.close()


def test_the_sandbox_runs_only_modulelens_code_it_is_told_to_run(tmp_path):
    from modulelens.sandbox.candidate_process import CandidateProcess
    from modulelens.sandbox.worker import load_runner
    from modulelens.validation.tasks import RUNNER

    assert load_runner(VALIDATION_WORKER.runner) is RUNNER
    for bad in ("os:system", "json:loads", "modulelens.validation.tasks:RUNNER()", "modulelens.validation.tasks"):
        with pytest.raises(ValueError, match="task runner"):
            load_runner(bad)
    for bad in ("evil", "modulelens.x; rm -rf /", "modulelens..x"):
        with pytest.raises(ValueError, match="harness"):
            CandidateProcess(bad, WORKER_MESSAGES, memory_limit_mb=256, read_only=[], parent=tmp_path)
    assert list(tmp_path.iterdir()) == []  # refused before anything was made


@pytest.mark.slow
def test_a_worker_whose_environment_changed_is_replaced(monkeypatch):
    """A worker is a fork-server template: once torch or modulelens's files change under it (here:
    the environment key it was started with no longer matches), the next task gets a fresh one."""
    import modulelens.sandbox.pool as pools

    pool = pools.SandboxPool(VALIDATION_WORKER, memory_limit_mb=4096)
    try:
        assert isinstance(pool.run(PingTask(), timeout=120), PongResult) and pool.started == 1
        monkeypatch.setattr(pools, "environment_key", lambda: "torch was upgraded")
        assert isinstance(pool.run(PingTask(), timeout=120), PongResult) and pool.started == 2
    finally:
        pool.close()
