"""The worker-process protocol (modulelens.capture.worker_process): typed request and result
files, failures as one-line errors, output relayed to stderr only, and the timeout."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from pydantic import BaseModel

from modulelens.capture.worker import CaptureWorkerRequest, CaptureWorkerResult
from modulelens.capture.worker_process import (
    WorkerFailure,
    WorkerResult,
    read_worker_result,
    run_worker_process,
)
from modulelens.errors import CaptureFailed, ModuleLensError

_CHILD = """
import sys
from pathlib import Path
from pydantic import BaseModel
from modulelens.capture.worker_process import WorkerResult, worker_main
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
    print("working on", request.n)
    return Result(doubled=2 * request.n)

worker_main(run, Path(sys.argv[1]), Path(sys.argv[2]), "doubling", request_model=Request)
print("never printed")
"""


class Request(BaseModel):
    n: int


class Result(WorkerResult):
    doubled: int


def _run_child(tmp_path: Path, n: int, relay: bool = False):
    request_file, result_file = tmp_path / "request.json", tmp_path / "result.json"
    request_file.write_text(Request(n=n).model_dump_json())
    done = run_worker_process([sys.executable, "-c", _CHILD, str(request_file), str(result_file)],
                              relay_to_stderr=relay, timeout=120, timeout_error=CaptureFailed("too slow"))
    return done, result_file


def test_worker_result_round_trip(tmp_path, capfd):
    done, result_file = _run_child(tmp_path, 21, relay=True)
    assert done.code == 0 and done.output_tail == "working on 21"  # the worker left right after writing
    assert read_worker_result(result_file, Result) == Result(doubled=42)
    out, err = capfd.readouterr()
    assert "working on 21" in err and "working on" not in out  # relayed to stderr, never stdout


def test_worker_failures_become_one_line_errors(tmp_path, capfd):
    _, result_file = _run_child(tmp_path, -1)
    with pytest.raises(ModuleLensError, match="n is negative") as e:
        read_worker_result(result_file, Result)
    assert e.value.hint == "give a positive n"
    _, result_file = _run_child(tmp_path, 0)
    failure = WorkerFailure.model_validate_json(result_file.read_text())
    assert failure.type == "InternalError" and "ZeroDivisionError: boom" in failure.error and "Traceback" in (failure.hint or "")
    assert capfd.readouterr().err == ""  # not relayed when not asked
    assert read_worker_result(tmp_path / "absent.json", Result) is None


def test_worker_timeout_raises_the_callers_error():
    with pytest.raises(CaptureFailed, match="too slow"):
        run_worker_process([sys.executable, "-c", "import time; print('start', flush=True); time.sleep(60)"],
                           relay_to_stderr=False, timeout=2, timeout_error=CaptureFailed("too slow"))


def test_capture_worker_request_has_no_defaults():
    """Every field is decided by the caller (no default repeated on the worker side)."""
    assert all(f.is_required() for f in CaptureWorkerRequest.model_fields.values())
    result = CaptureWorkerResult.model_validate_json('{"ok": true, "rank": 1, "world_size": 2, "recorded": false}')
    assert result.ref is None and result.notes == []
