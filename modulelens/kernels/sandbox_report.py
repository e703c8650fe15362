"""A sandbox worker's answer to a validation task, as a :class:`ValidationReport`.

(The same reading as ``tools/validate_kernel.py`` does inline today; issue 8's typed sandbox
results replace both.)
"""

from __future__ import annotations

from typing import Any

from modulelens.errors import ModuleLensError
from modulelens.kernels.report import ValidationReport


def report_from_sandbox(result: dict[str, Any], backend: str) -> ValidationReport:
    """A crash or timeout becomes a rejection; an internal error is raised; a candidate that
    wrote to stdout is rejected (it would corrupt an MCP stdio session)."""
    if "crashed" in result:
        stage = result.get("stage") or "starting"
        tail = result.get("stderr_tail", "")
        report = ValidationReport(verdict="rejected", correct=False, stage=stage, backend=backend,
                                  reason=f"the sandbox worker {result['crashed']} during {stage}", stderr_tail=tail,
                                  errors=[f"worker {result['crashed']} during {stage}"])
        if "memory" in tail.lower() or "bad_alloc" in tail:
            report.reason += " (out of memory)"
        return report
    if "internal_error" in result:
        raise ModuleLensError(f"internal error in the sandbox worker: {result['internal_error']}",
                              "please report it with this traceback: " + result.get("traceback", "")[-1000:])
    report = ValidationReport.model_validate(result["report"])
    report.stdout_bytes = result.get("stdout_bytes", 0)
    if report.stdout_bytes:
        report.verdict, report.correct = "rejected", False
        report.reason = (f"wrote {report.stdout_bytes} bytes to stdout: candidates must not print "
                         "(it would corrupt an MCP stdio session)")
    return report
