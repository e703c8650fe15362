"""The validation report of a candidate kernel, and the settings a validation runs with."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, Field

from modulelens.kernels import ShapeRule
from modulelens.sandbox import Isolation
from modulelens.timing import MeasurementDetail, Timing

DISTRIBUTIONS = ("normal", "uniform", "heavy", "special")


class CheckSettings(BaseModel):
    """What any validation does: fresh inputs, tolerances, timing (stored with its report)."""

    time: bool = Field(True, description="Time against eager (when the backend can be timed here).")
    seeds: list[int] = Field(default_factory=lambda: [0, 1], description="Seeds of the fresh inputs.")
    distributions: list[str] = Field(default_factory=lambda: list(DISTRIBUTIONS),
                                     description="Distributions of the fresh inputs (each seed draws every one).")
    rtol: float | None = Field(None, ge=0, description="Relative tolerance (default: per dtype).")
    atol: float | None = Field(None, ge=0, description="Absolute tolerance (default: per dtype, scaled by the output).")
    min_run_time: float = Field(0.3, gt=0, description="Seconds of timed rounds at least, eager and candidate together.")
    timing_budget_s: float = Field(3.0, gt=0, description="Seconds of timed rounds at most: the rounds stop there, "
                                   "the speedup determined or not.")
    target_width: float = Field(0.2, gt=0, description="Relative width of the speedup's 95% interval to reach "
                                "((high - low) / point); wider is undetermined.")


class ValidationSettings(CheckSettings):
    """One validation of a card candidate."""

    card_id: str = Field(description="The card validated against (<opset ref>/<index>).")
    device: str | None = Field(None, description="Device to run on (default: the card's; refused where torch sees no such device).")
    compile_baseline: bool = Field(False, description="Also time torch.compile of the operator.")


class ModuleValidationSettings(CheckSettings):
    """One validation of a module-level candidate (KernelBench ModelNew) against its capture."""

    capture: str = Field(description="The capture ref (name:vN) the candidate replaces.")
    device: str | None = Field(None, description="Device to run on (default: the captured one; refused where torch "
                               "sees no such device).")
    min_run_time: float = Field(0.6, gt=0, description="Seconds of timed rounds at least, original and candidate together.")


class Check(BaseModel):
    name: str
    passed: bool
    detail: str = ""


class Accuracy(BaseModel):
    """One output's errors against the float64 oracle (the reference run in float64), the
    candidate's beside eager's own: reported when the plain tolerance was not enough."""

    case: str = Field(description="The check (inputs and parameters) the output belongs to.")
    output: int
    candidate_max_abs: float | None = Field(description="Largest absolute error of the candidate against the oracle "
                                            "(null: not finite, a NaN or infinity where the oracle is finite).")
    eager_max_abs: float | None = Field(description="Largest absolute error of eager (captured dtype) against it.")
    candidate_rel_l2: float | None
    eager_rel_l2: float | None
    allowed_multiple: float = Field(description="Accepted when the candidate's errors are at most this multiple of "
                                    "eager's (plus one unit of rounding).")
    absolute_floor: float | None = Field(None, description="A gradient at rounding-noise scale (its float64 value "
                                         "within this floor): accepted when the candidate's max abs error is at most "
                                         "the floor (or the multiple of eager's, if larger); null: judged by the multiple.")
    accepted: bool


def finite_or_none(x: float) -> float | None:
    """``x``, or None when it is not finite (JSON has no infinity)."""
    return x if math.isfinite(x) else None


class Denial(BaseModel):
    """The candidate run once more in a fresh contained process where the reference library is
    denied before any of its code loads: a candidate that stays correct there computes by itself."""

    outcome: Literal["computes itself", "fails", "inconclusive"] = Field(
        description="computes itself: correct there; fails: raised, died or was wrong there (a wrapper of what was "
        "denied); inconclusive: it could not be built there, so nothing is confirmed.")
    detail: str = Field(description="What happened there, in one sentence.")
    denied: str = Field(description="What was denied, and how (which parts the candidate could not undo).")


class ExtensionBuild(BaseModel):
    """One extension a module candidate built with ``load_inline`` and the checker verified and
    published in the build cache: where a pack loads it from (same toolchain: the address covers it)."""

    name: str = Field(description="The extension's name (load_inline's name=).")
    address: str = Field(description="Content address in the build cache (source, name, toolchain).")
    sha256: str = Field(description="sha256 of the verified library file.")


class ValidationReport(BaseModel):
    verdict: Literal["custom", "wrapper", "rejected"] = Field(
        description="custom: correct and computes itself; wrapper: correct but calls back into torch or vendor "
        "libraries for the computation; rejected: see reason.")
    correct: bool = Field(description="Every correctness check passed (captured and fresh inputs, after timing too).")
    reason: str = Field(description="Why this verdict, in one sentence.")
    stage: str = Field(description="Last stage reached: compile, load, check, time, recheck, denial, done.")
    backend: str
    compiled: bool = False
    ran: bool = Field(False, description="The candidate ran here (False for CUDA without a GPU: compile-checked only).")
    checks: list[Check] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list, description="Short compile/runtime errors, usable in a repair prompt.")
    backend_calls: list[str] = Field(default_factory=list, description="torch/vendor operators the candidate called.")
    flags: list[str] = Field(default_factory=list, description="Suspicious findings (speedups beyond belief, ...).")
    eager: Timing | None = None
    candidate: Timing | None = None
    compiled_baseline: Timing | None = Field(None, description="torch.compile of the same operator, when asked for.")
    speedup_vs_eager: float | None = Field(
        None, description="Eager time / candidate time (median of interleaved paired rounds); null when not timed "
        "or undetermined (see timing_status).")
    speedup_interval: list[float] | None = Field(None, description="95% interval [low, high] of the speedup over "
                                                 "eager; null when not timed. Decisions use low.")
    timing_status: Literal["ok", "undetermined"] | None = Field(
        None, description="ok: speedup_vs_eager is determined; undetermined: too noisy to tell (the number is null, "
        "timing_reason says why); null: not timed.")
    timing_reason: str = Field("", description="Why the speedup is or is not determined.")
    speedup_vs_compile: float | None = Field(None, description="torch.compile time / candidate time; null when not "
                                             "asked, not timed or undetermined.")
    speedup_vs_compile_interval: list[float] | None = None
    compile_timing_status: Literal["ok", "undetermined"] | None = None
    compile_timing_reason: str = ""
    measurement: MeasurementDetail | None = Field(None, description="How the speedup over eager was measured: "
                                                  "rounds, threads and why, findings, method.")
    timing_note: str = Field("", description="One line: what was timed, how, with which threads, and why the "
                             "speedup is or is not determined.")
    stdout_bytes: int = 0
    stderr_tail: str = ""
    isolation: Isolation | None = Field(None, description="Containment layers that were in force around the candidate.")
    wrapper_evidence: str = Field("", description="What the custom/wrapper decision was based on, and what it cannot see.")
    extensions: list[ExtensionBuild] = Field(default_factory=list, description="Module candidates: the builds of "
                                             "its load_inline extensions this validation verified and published.")
    library_ops: list[str] = Field(default_factory=list, description="Library operators (matrix products, "
                                   "convolutions, attention) a module candidate declares it keeps and that were left "
                                   "usable in its denial run (``# modulelens-library-ops:``).")
    computes_itself: list[str] = Field(default_factory=list, description="With library_ops: the computing operators "
                                       "eager runs for this module besides those, which the candidate computes itself.")
    denial: Denial | None = Field(None, description="The run where the reference library was denied (only for a "
                                  "candidate with no other wrapper evidence).")
    varied: list[str] = Field(default_factory=list, description="Tensor arguments (card) or parameters and buffers "
                              "(module) drawn afresh in the checks beside the captured ones.")
    varied_how: str = Field("", description="How they were drawn.")
    edge_cases: list[str] = Field(default_factory=list, description="The operator's own edge cases checked (card) "
                                  "or the edge cases of the captured module (module): 'what (source)'.")
    edge_cases_note: str = Field("", description="Edge cases that did not run and why (a Triton kernel under the "
                                 "interpreter gets a few); '' when every one ran.")
    failed_edge_case: str | None = Field(None, description="The edge case that exposed the rejection (its label), "
                                         "when one did: fix the source for it and validate again.")
    accuracy: list[Accuracy] = Field(default_factory=list, description="Errors against the float64 oracle, where "
                                     "the plain tolerance was not enough.")
    shape_rule: ShapeRule | None = Field(None, description="The variable dimensions the candidate declared, checked at "
                                         "sizes not captured: a pack entry admits sizes 1 to the largest checked.")
    seconds: float = 0.0
