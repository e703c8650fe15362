"""The stored records of a ``stats`` artifact, typed: ``series.json`` (:class:`RunSeries` for a
training run, :class:`CaptureSeries` for a capture) and ``findings.json`` (:class:`StatsFinding`).

Every reader of a stored run goes through :func:`read_series` and :func:`read_findings`; nothing
reads the stored JSON by string key. Fields added later have defaults, so files written by
earlier versions load (``schema`` 1: no softmax columns, no NaN/Inf origin).

A *column* holds one value per sampled step (aligned with ``steps``): None where a module was not
called or a statistic is undefined. Statistic names are those of
:data:`modulelens.stats.stats.DEFINITIONS`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from modulelens.repo import Artifact

SCHEMA = 2  # 2: softmax columns per module, the NaN/Inf origin of a rerun

Cell = bool | int | float | None
Column = list[Cell]
Phase = Literal["forward", "backward", "optimizer"]
TensorRole = Literal["input", "output", "weight", "gradient"]


def cell(column: Column | None, i: int) -> Cell:
    """The value of ``column`` at step index ``i`` (None past its end or without a column)."""
    return column[i] if column is not None and 0 <= i < len(column) else None


class ModuleColumns(BaseModel):
    """One module's series: statistics of its output (``activation``), of the gradient w.r.t. its
    output (``gradient``), their EMA-smoothed forms, and of the softmax it computes (``softmax``:
    ``entropy`` (mean over rows of entropy / log(number of unmasked entries)), ``max_prob`` (mean
    over rows of the largest probability), ``onehot_frac`` (rows with a largest probability of
    at least 0.99), ``rows``, ``calls``; ``softmax_source`` says where they were taken)."""

    type: str = ""
    class_path: str = ""
    index: int = Field(0, description="position in execution order")
    activation: dict[str, Column] = Field(default_factory=dict)
    activation_ema: dict[str, Column] = Field(default_factory=dict)
    gradient: dict[str, Column] = Field(default_factory=dict)
    gradient_ema: dict[str, Column] = Field(default_factory=dict)
    softmax: dict[str, Column] = Field(default_factory=dict)
    softmax_source: list[str] = Field(default_factory=list, description="softmax, log_softmax, "
                                      "scaled_dot_product_attention (weights recomputed from q and k)")

    def at(self, kind: Literal["activation", "gradient", "softmax"], stat: str, i: int) -> Any:
        """The value of ``kind``'s ``stat`` at step index ``i``, or None."""
        return cell(getattr(self, kind).get(stat), i)


class ParamColumns(BaseModel):
    """One parameter's series (see :func:`modulelens.stats.series.param_stats`)."""

    module: str = ""
    shape: list[int] = Field(default_factory=list)
    requires_grad: bool = Field(True, description="False: in the optimizer but frozen (requires_grad False on "
                                "a sampled step)")
    weight_norm: Column = Field(default_factory=list)
    weight_rms: Column = Field(default_factory=list)
    grad_norm: Column = Field(default_factory=list)
    grad_rms: Column = Field(default_factory=list)
    grad_to_weight: Column = Field(default_factory=list)
    update_ratio: Column = Field(default_factory=list)
    update_ratio_ema: Column = Field(default_factory=list)
    dead_rows: Column = Field(default_factory=list, description="fraction of the weight's rows (units) whose "
                              "gradient was exactly zero on this sampled step and the previous one")
    nonfinite_weight: Column = Field(default_factory=list)
    nonfinite_grad: Column = Field(default_factory=list)


class TypeColumns(BaseModel):
    """Aggregates over the modules of one type (means over modules; min/max/counts combined)."""

    modules: list[str] = Field(default_factory=list)
    activation: dict[str, Column] = Field(default_factory=dict)
    gradient: dict[str, Column] = Field(default_factory=dict)
    update_ratio: Column = Field(default_factory=list)


class NonfiniteCall(BaseModel):
    module: str
    input_nonfinite: bool = False


class NonfiniteEvent(BaseModel):
    """A sampled step where module outputs or gradients held NaN/Inf: the calls (in the order they
    finished) and the modules whose output gradient held them (in the order they arrived)."""

    step: int
    calls: list[NonfiniteCall] = Field(default_factory=list)
    grads: list[str] = Field(default_factory=list)


class NanOrigin(BaseModel):
    """Where NaN/Inf first appeared, found by rerunning the script with a non-finite check on every
    output, gradient and parameter of every step up to the first sampled step that held them."""

    found: bool = Field(description="False: the rerun reached the step without NaN/Inf (the script does not repeat "
                        "itself), or was stopped; see detail")
    step: int | None = None
    phase: Phase | None = None
    tensor: TensorRole | None = Field(None, description="what held the first NaN/Inf: a module's input (from the data "
                                      "or code outside modules), its output, a weight, or a gradient")
    module: str | None = Field(None, description="the module whose code produced them ('' is the root)")
    seen_in: str | None = Field(None, description="the tensor where they were seen: 'output of X', 'input of X', "
                                "'gradient w.r.t. the input of X', 'X.weight after optimizer.step()'")
    parameter: str | None = None
    detail: str = ""
    steps_checked: int = 0
    seconds: float = 0.0


class RunSeries(BaseModel):
    """``series.json`` of a training run (see :mod:`modulelens.stats.series`)."""

    model_config = ConfigDict(populate_by_name=True)

    source: Literal["run"] = "run"
    schema_version: int = Field(SCHEMA, alias="schema")
    steps: list[int] = Field(default_factory=list)
    every: int | None = None
    steps_seen: int = 0
    step_on: str = "optimizer"
    ema_alpha: float | None = None
    sample: int | None = None
    order: list[str] = Field(default_factory=list)
    order_source: str = "observed"
    modules: dict[str, ModuleColumns] = Field(default_factory=dict)
    params: dict[str, ParamColumns] = Field(default_factory=dict)
    types: dict[str, TypeColumns] = Field(default_factory=dict)
    nonfinite: list[NonfiniteEvent] = Field(default_factory=list)
    nan_origin: NanOrigin | None = None
    notes: list[str] = Field(default_factory=list)
    definitions: dict[str, str] = Field(default_factory=dict)

    def at(self, name: str, kind: Literal["activation", "gradient", "softmax"], stat: str, i: int) -> Any:
        """Module ``name``'s ``kind`` ``stat`` at step index ``i``, or None."""
        m = self.modules.get(name)
        return m.at(kind, stat, i) if m is not None else None


class TensorEntry(BaseModel):
    """The statistics of one tensor of a capture."""

    group: Literal["input", "output", "weight", "gradient"]
    shape: list[int] = Field(default_factory=list)
    dtype: str = ""
    stored: bool = True
    stats: dict[str, Cell] = Field(default_factory=dict)


class CaptureSeries(BaseModel):
    """``series.json`` of a capture's statistics (see :func:`modulelens.stats.artifact.capture_series`)."""

    model_config = ConfigDict(populate_by_name=True)

    source: Literal["capture"] = "capture"
    schema_version: int = Field(SCHEMA, alias="schema")
    capture: str = ""
    module_path: str = ""
    class_path: str = ""
    tensors: dict[str, TensorEntry] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)
    definitions: dict[str, str] = Field(default_factory=dict)


class StatsFinding(BaseModel):
    """One finding of ``findings.json`` (see :mod:`modulelens.stats.findings`)."""

    kind: str = Field(description="dead_activation, zero_scale, exploding_activation, vanishing_activation, "
                      "exploding_gradient, exploding_parameter_gradient, exploding_update, no_gradient, saturation, "
                      "softmax_saturation, nan_inf or nan_inf_gradient.")
    module: str = Field(description="Qualified module name ('' is the root model).")
    step: int = Field(description="Sampled step whose numbers the message gives (the last one where it held); "
                      "nan_inf found by a rerun: the step where NaN/Inf was born.")
    first_step: int | None = Field(None, description="First sampled step where the finding held.")
    last_step: int | None = Field(None, description="Last sampled step where the finding held.")
    steps_held: int = Field(1, description="Number of sampled steps where the finding held (every sampled step "
                            "before the first NaN/Inf is judged; for nan_inf: steps with non-finite values).")
    severity: Literal["error", "warning"] = "error"
    message: str = Field(description="What is wrong, in plain language.")
    action: str = Field(description="What to try.")
    based_on: list[str] = Field(default_factory=list, description="The observations (across modules and steps) "
                                "that the action follows from.")
    found_by: Literal["sampled steps", "rerun"] = Field("sampled steps", description="rerun: the script was rerun "
                                                         "with a NaN/Inf check on every step to find the origin.")
    phase: Phase | None = Field(None, description="nan_inf: the phase of the step where NaN/Inf was born.")
    tensor: TensorRole | None = Field(None, description="nan_inf: what held them first.")
    evidence: dict[str, Any] = Field(default_factory=dict, description="The numbers behind it.")


def read_series(art: Artifact) -> RunSeries | CaptureSeries:
    """The typed ``series.json`` of a ``stats`` artifact (a run's or a capture's)."""
    data = art.read_json("series.json")
    if isinstance(data, dict) and data.get("source") == "capture":
        return CaptureSeries.model_validate(data)
    return RunSeries.model_validate(data)


def read_findings(art: Artifact) -> list[StatsFinding]:
    """The typed ``findings.json`` of a ``stats`` artifact."""
    return [StatsFinding.model_validate(f) for f in art.read_json("findings.json")]


def dump(record: BaseModel | list[BaseModel]) -> str:
    """The stored JSON of a series or a list of findings (compact; NaN/Inf written as null)."""
    if isinstance(record, list):
        return "[" + ",".join(r.model_dump_json(by_alias=True) for r in record) + "]"
    return record.model_dump_json(by_alias=True)
