"""Validation: judging candidate kernels (card candidates and module-level ``ModelNew``
candidates) for correctness, wrapper use and speed, and storing the verdicts.

The caller's side (:mod:`.sandboxed`) sends a task to a sandbox worker of kind
:data:`.messages.VALIDATION_WORKER` and turns its answer into a stored report; inside the worker
:data:`.tasks.RUNNER` hands each task to a checker (:mod:`.card`, :mod:`.module` with its steps in
:mod:`.module_checks`, both built on :mod:`.checker`), which holds the reference, the clock and the verdict; the candidate runs in its
own contained process (started by :func:`.checker.start_candidate`) under :mod:`.harness`.

Public face (import these from their modules; this ``__init__`` imports nothing, because the
candidate harness runs as ``python -m modulelens.validation.harness`` and must not load the
checker before its containment is in place):

* :mod:`.sandboxed`: ``validate_candidate``, ``validate_in_sandbox``, ``time_candidate``,
  ``validation_report``, ``interrupted_report``, ``CandidateValidation``, ``pool``, ``new_pool``,
  ``DEFAULT_TIMEOUT_S``, ``VALIDATION_STAGES``;
* :mod:`.report`: ``ValidationReport``, ``ValidationSettings``, ``ModuleValidationSettings``,
  ``CheckSettings``, ``Check``, ``DISTRIBUTIONS``;
* :mod:`.stored_reports`: ``save_report``, ``latest_report``, ``report_name``, ``ReportManifest``,
  ``REPORTS``, ``REPORT_FILE``;
* :mod:`.catalog`: ``candidate_entries``, ``candidate_view``, ``first_source_lines``,
  ``CandidateEntry``, ``CandidateView``;
* :mod:`.messages`: the tasks and results (``ValidateCardTask``, ``ValidateModuleTask``,
  ``ModuleSource``, ``TimeCandidateTask``, ``PingTask``, ``ValidatedResult``, ...),
  ``VALIDATION_WORKER``;
* :mod:`.plausibility`: ``speedup_flags``; :mod:`.compare`: ``compare_output``, ``within_oracle``;
  :mod:`.inputs`: ``fresh_inputs``, ``fresh_state``, ``tensors``; :mod:`.evidence`:
  ``library_symbols``, ``built_library_symbols``, ``computing_ops``; :mod:`.denial`:
  ``check_by_denial`` (the run where the reference library is denied; :mod:`.poison` is what that
  process does to itself).

Layering (checked by ``tests/test_imports.py``): validation may import ``kernels`` (backends,
build cache, KernelSource, candidate artifacts), ``sandbox``, ``timing``, ``ops``, ``capture``,
``repo`` and leaf modules; ``kernels`` does not import validation; ``sandbox`` imports neither
kernels nor validation (it is told what to run); ``timing`` imports nothing of modulelens but
leaves; ``profiling`` imports neither kernels nor validation.
"""
