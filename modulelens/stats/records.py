"""What a statistics run gathers, in host values: one :class:`StepRecord` per sampled step and the
:class:`StatsRun` that holds them (the collector's output, :func:`modulelens.stats.series.build_series`'s
input). Plain dataclasses: they never leave the process (``series.json`` is the stored form)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ModuleStep:
    """One module over one sampled step (all its recorded calls merged)."""

    type: str
    act: list[float] | None = None  # merged moment vector of all floating outputs of all calls
    in_sq: float = 0.0  # sum of squares of the floating inputs (all calls)
    in_numel: int = 0
    in_nonfinite: bool = False
    in_max: float | None = None  # largest element of the floating inputs (None: unknown, see in_max_known)
    in_max_known: bool = True  # every input was an earlier output of the step, whose moments give its max
    calls: int = 0
    grad: list[float] | None = None
    saturation: bool = False
    class_path: str = ""
    # Softmax computed inside this module's calls (see modulelens.stats.softmax.SOFTMAX_FIELDS), merged
    # by addition, and where they were taken.
    softmax: list[float] | None = None
    softmax_sources: list[str] = field(default_factory=list)


@dataclass
class ParamStep:
    """One parameter at one sampled optimizer step."""

    module: str
    numel: int = 0
    weight_norm: float = 0.0  # L2 norm before the optimizer step (inf/NaN: it holds Inf/NaN)
    grad_norm: float | None = None
    update_ratio: float | None = None
    dead_rows: float | None = None  # fraction of the weight's rows with a zero gradient here and on the last sampled step
    requires_grad: bool = True  # False: in the optimizer but frozen (requires_grad_(False))


@dataclass
class StepRecord:
    step: int
    modules: dict[str, ModuleStep] = field(default_factory=dict)
    params: dict[str, ParamStep] = field(default_factory=dict)
    # Calls whose output held NaN/Inf, in the order the calls finished: (module, input_nonfinite).
    nonfinite: list[tuple[str, bool]] = field(default_factory=list)
    # Modules whose output gradient held NaN/Inf, in the order the gradients arrived.
    nonfinite_grads: list[str] = field(default_factory=list)


@dataclass
class StatsRun:
    """Everything a run gathered, ready for :func:`modulelens.stats.series.build_series`."""

    records: list[StepRecord]
    order: list[str]
    order_source: str
    types: dict[str, str]  # module name -> class name
    class_paths: dict[str, str]
    param_shapes: dict[str, list[int]]
    every: int
    steps_seen: int
    step_on: str
    notes: list[str]
    compiled: bool = False
    sample: int | None = None  # moments of larger tensors estimated from a strided view of this many elements
