"""Validation: judging candidate kernels (card candidates and module-level ``ModelNew``
candidates) for correctness, wrapper use and speed, and storing the verdicts.

The caller's side (:mod:`.sandboxed`) sends a task to a sandbox worker and turns its answer into a
stored report; inside the worker the checker (:mod:`.card`, :mod:`.module`) holds the reference,
the clock and the verdict, and the candidate runs in its own contained process whose harness is
:mod:`.harness`.

Layering (checked by ``tests/test_imports.py``): validation may import ``kernels`` (backends,
build cache, KernelSource, candidate artifacts), ``sandbox``, ``timing``, ``ops``, ``capture``,
``repo`` and leaf modules; ``kernels`` does not import validation; ``sandbox`` imports neither
kernels nor validation (it is told what to run); ``timing`` imports nothing of modulelens but
leaves; ``profiling`` imports neither kernels nor validation.
"""
