"""Validation: judging candidate kernels (card candidates and module-level ``ModelNew``
candidates) for correctness, wrapper use and speed, and storing the verdicts.

The caller's side (:mod:`.sandboxed`) sends a task to a sandbox worker of kind
:data:`.messages.VALIDATION_WORKER` and turns its answer into a stored report; inside the worker
:data:`.tasks.RUNNER` hands each task to a checker (:mod:`.card`, :mod:`.module` with its steps in
:mod:`.module_checks`, both built on :mod:`.checker`), which holds the reference, the clock and the verdict; the candidate runs in its
own contained process (started by :func:`.checker.start_candidate`) under :mod:`.harness`.

Public face: other packages import only the names below, from ``modulelens.validation``. Each
is imported from its module on first use (:func:`modulelens.faces.lazy_face`), because the
candidate harness runs as ``python -m modulelens.validation.harness`` and must not load the
checker before its containment is in place.

Layering (checked by ``tests/test_imports.py``): validation may import ``kernels`` (backends,
build cache, KernelSource, candidate artifacts), ``sandbox``, ``timing``, ``ops``, ``capture``,
``repo`` and leaf modules; ``kernels`` does not import validation; ``sandbox`` imports neither
kernels nor validation (it is told what to run); ``timing`` imports nothing of modulelens but
leaves; ``profiling`` imports neither kernels nor validation.
"""

from modulelens.faces import lazy_face

# The validation worker's task runner, as the sandbox worker loads it (``package.module:NAME``).
VALIDATION_RUNNER = "modulelens.validation.tasks:RUNNER"

_FACE = {
    # Validating and timing a candidate in a sandbox worker (the caller's side).
    "CandidateValidation": "sandboxed", "DEFAULT_TIMEOUT_S": "sandboxed", "new_pool": "sandboxed",
    "remeasure_candidates": "sandboxed", "time_candidate": "sandboxed", "validate_candidate": "sandboxed",
    "validate_stored_module": "module_runs",
    # The verdict and its settings; what an agent is told about it.
    "ValidationReport": "report", "ExtensionBuild": "report", "ValidationSettings": "report", "RemeasuredResult": "messages",
    "MAX_BELIEVABLE_SPEEDUP": "plausibility",
    "report_next": "advice", "report_warnings": "advice", "surely_faster": "advice", "brief_report": "brief",
    # Stored verdicts and the catalog of stored candidates.
    "REPORTS": "stored_reports", "REPORT_FILE": "stored_reports", "ReportManifest": "stored_reports",
    "latest_report": "stored_reports", "latest_verdict": "stored_reports", "report_name": "stored_reports", "save_report": "stored_reports",
    "CandidateEntry": "catalog", "CandidateView": "catalog", "ReportEntry": "catalog",
    "candidate_entries": "catalog", "candidate_view": "catalog", "first_source_lines": "catalog",
    "report_entries": "catalog", "stored_report": "catalog",
}
__all__ = ["VALIDATION_RUNNER", *_FACE]
__getattr__, __dir__ = lazy_face(__name__, _FACE)
