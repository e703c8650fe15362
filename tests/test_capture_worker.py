"""The worker-process protocol and launcher (modulelens.workers): typed request and result files,
failures as one-line errors, a worker that dies without a result named with how it ended and its
last output, output relayed to stderr only, and the timeout."""

from __future__ import annotations

import os
import sys

import pytest
from pydantic import BaseModel

from modulelens.capture.worker import CaptureWorkerRequest, CaptureWorkerResult
from modulelens.errors import CaptureFailed, ModuleLensError
from modulelens.workers import (
    WorkerDied,
    WorkerFailure,
    WorkerResult,
    how_it_ended,
    launch_worker,
    read_worker_result,
    run_worker_process,
)

_CHILD = """
import os
import signal
import sys
from pydantic import BaseModel
from modulelens.workers import WorkerResult, worker_main
from modulelens.errors import ModuleLensError

class Request(BaseModel):
    n: int

class Result(WorkerResult):
    doubled: int

def run(request):
    if request.n < 0:
        raise ModuleLensError("n is negative", "give a positive n")
    if request.n == 0:
        raise ZeroDivisionError("boom")
    print("working on", request.n, *(["in", os.getcwd()] if request.n == 1 else []))
    if request.n == 13:
        print("about to die", flush=True)
        os.kill(os.getpid(), signal.SIGSEGV)
    return Result(doubled=2 * request.n)

if __name__ == "__main__":
    worker_main(run, sys.argv[1:], "doubling", Request)
    print("never printed")
"""


class Request(BaseModel):
    n: int


class Result(WorkerResult):
    doubled: int


@pytest.fixture
def child(tmp_path, monkeypatch) -> str:
    """A worker module of its own (``python -m doubling_worker``), found through PYTHONPATH."""
    (tmp_path / "doubling_worker.py").write_text(_CHILD)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    return "doubling_worker"


def _launch(child: str, n: int, cwd: os.PathLike[str] | str = "."):
    return launch_worker(child, Request(n=n), Result, what="doubling", timeout=120,
                         timeout_error=CaptureFailed("too slow"), cwd=cwd)


def test_worker_result_round_trip(child, capfd):
    run = _launch(child, 21)
    assert run.exit_code == 0 and run.output_tail == "working on 21"  # the worker left right after writing
    assert run.results == {0: Result(doubled=42)} and run.result() == Result(doubled=42)
    out, err = capfd.readouterr()
    assert "working on 21" in err and "working on" not in out  # relayed to stderr, never stdout


def test_worker_failures_become_one_line_errors(child, tmp_path):
    with pytest.raises(ModuleLensError, match="n is negative") as e:
        _launch(child, -1)
    assert e.value.hint == "give a positive n"
    with pytest.raises(ModuleLensError, match="internal error in the doubling worker: ZeroDivisionError: boom") as e:
        _launch(child, 0)
    assert "Traceback" in (e.value.hint or "")
    assert read_worker_result(tmp_path / "absent.json", Result) is None
    bad = tmp_path / "bad.json"
    bad.write_text(WorkerFailure(error="boom", hint="fix").model_dump_json())
    with pytest.raises(ModuleLensError, match="boom"):
        read_worker_result(bad, Result)


def test_a_worker_that_dies_without_a_result_is_named_with_its_end_and_last_output(child):
    with pytest.raises(WorkerDied) as e:
        _launch(child, 13)
    assert e.value.message == "the doubling worker crashed with SIGSEGV without a result"
    assert (e.value.hint or "").endswith("working on 13\nabout to die")
    assert how_it_ended(3) == "exited with code 3"


def test_worker_timeout_raises_the_callers_error():
    with pytest.raises(CaptureFailed, match="too slow"):
        run_worker_process([sys.executable, "-c", "import time; print('start', flush=True); time.sleep(60)"],
                           relay_to_stderr=False, timeout=2, timeout_error=CaptureFailed("too slow"))


def test_a_worker_runs_in_the_folder_named_and_a_missing_one_is_one_line(child, tmp_path):
    assert _launch(child, 1, cwd=tmp_path).output_tail == f"working on 1 in {tmp_path}"
    with pytest.raises(ModuleLensError, match=f"the folder to run the script in, {tmp_path / 'gone'}, is not a folder"):
        _launch(child, 1, cwd=tmp_path / "gone")


def test_capture_worker_request_has_no_defaults():
    """Every field is decided by the caller (no default repeated on the worker side)."""
    assert all(f.is_required() for f in CaptureWorkerRequest.model_fields.values())
    result = CaptureWorkerResult.model_validate_json('{"ok": true, "rank": 1, "world_size": 2, "recorded": false}')
    assert result.ref is None and result.notes == []
