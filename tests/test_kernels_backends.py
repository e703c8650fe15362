"""The backend and provider tables, the shared build cache, and what a sandbox result amounts to
as a validation report (modulelens.kernels.backends.base, .build_cache, .sandboxed,
modulelens.providers.base)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from modulelens.errors import ModuleLensError
from modulelens.kernels import build_cache
from modulelens.kernels.backends.base import BACKENDS, get_backend
from modulelens.validation.report import ValidationReport
from modulelens.validation.sandboxed import validation_report
from modulelens.providers.base import PROVIDERS, get_provider
from modulelens.validation.messages import CrashedResult, InternalErrorResult, PongResult, ValidatedResult


def test_tables_name_every_implementation():
    assert set(BACKENDS) == {"cpp", "cuda", "triton"}
    for name in BACKENDS:
        assert get_backend(name).name == name
    assert set(PROVIDERS) == {"template", "anthropic", "sampling"}
    for name in PROVIDERS:
        assert get_provider(name).name == name
    with pytest.raises(ModuleLensError, match="unknown backend 'rust'"):
        get_backend("rust")
    with pytest.raises(ModuleLensError, match="unknown provider 'nope'") as e:
        get_provider("nope")
    assert "template, anthropic, sampling" in e.value.hint


def test_the_tables_import_no_implementation():
    code = ("import sys, modulelens.kernels.backends.base, modulelens.providers.base\n"
            "print(sorted(m for m in sys.modules if m.rsplit('.', 1)[-1] in "
            "('cpp', 'cuda', 'triton', 'template', 'anthropic', 'sampling') and m.startswith('modulelens.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_build_cache_remembers_only_failures_in_the_source(tmp_path):
    assert build_cache.source_key("a", "b") == build_cache.source_key("a", "b") != build_cache.source_key("ab")
    env_failure = tmp_path / "env"
    env_failure.mkdir()
    build_cache.remember_failure(env_failure, "c++: not found", "log 1")
    assert build_cache.previous_failure(env_failure) is None and build_cache.read_log(env_failure) == "log 1"
    source_failure = tmp_path / "src"
    source_failure.mkdir()
    build_cache.remember_failure(source_failure, "<source>:3:5: error: x", "log 2")
    assert build_cache.previous_failure(source_failure) == ("<source>:3:5: error: x", "log 2")
    assert build_cache.loaded("ml_nothing_built") is None


def _report(**kw) -> ValidationReport:
    return ValidationReport(verdict="custom", correct=True, reason="fine", stage="done", backend="cpp", **kw)


def test_a_worker_report_is_the_verdict_unless_the_candidate_printed():
    assert validation_report(ValidatedResult(report=_report()), "cpp") == _report()
    printed = validation_report(ValidatedResult(report=_report(), stdout_bytes=12), "cpp")
    assert printed.verdict == "rejected" and not printed.correct and printed.stdout_bytes == 12
    assert "wrote 12 bytes to stdout" in printed.reason


def test_a_dead_worker_is_a_rejection_that_says_why():
    r = validation_report(CrashedResult(reason="crashed with SIGSEGV", stage="check", stderr_tail=""), "triton")
    assert (r.verdict, r.correct, r.stage, r.backend) == ("rejected", False, "check", "triton")
    assert r.reason == "the sandbox worker crashed with SIGSEGV during check"
    assert r.errors == ["worker crashed with SIGSEGV during check"]
    oom = validation_report(CrashedResult(reason="exited with code 1", stderr_tail="std::bad_alloc"), "cpp")
    assert oom.stage == "starting" and oom.reason.endswith("(out of memory)")


def test_internal_errors_and_wrong_answers_are_errors():
    with pytest.raises(ModuleLensError, match="internal error in the sandbox worker: KeyError") as e:
        validation_report(InternalErrorResult(error="KeyError: 'x'", traceback="TB"), "cpp")
    assert "TB" in e.value.hint
    with pytest.raises(ModuleLensError, match="with a pong result"):
        validation_report(PongResult(), "cpp")


def test_builds_against_another_torch_installation_get_folders_of_their_own(monkeypatch):
    """A build's ninja file names torch's headers by path: two virtual environments sharing one
    build folder made ninja rebuild it each time the other one loaded it."""
    from modulelens.kernels.module_builds import module_build_address

    cpp, source = get_backend("cpp"), "int forward() { return 1; }"
    here = (cpp.build_name(source), module_build_address(source, "ext"))
    assert (cpp.build_name(source), module_build_address(source, "ext")) == here  # the same installation shares
    monkeypatch.setattr(build_cache, "torch_location", lambda: "/elsewhere/.venv/lib/python3.11/site-packages/torch")
    elsewhere = (cpp.build_name(source), module_build_address(source, "ext"))
    assert elsewhere[0] != here[0] and elsewhere[1] != here[1]
