"""A captured call as the tracer holds it until it is stored, and the helpers shared by the tracer,
batch slicing and replay: RNG and autocast state, inputs given back as they were in the run, and
buffers restored."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

from modulelens.capture.manifest import ActivationStorage, UnrecordedField, WeightStorage
from modulelens.capture.spec import ModuleSpec, TensorSpec
from modulelens.capture.values import Encoder, TensorSink, parse_dtype


def rng_states() -> dict[str, torch.Tensor]:
    states = {"cpu": torch.random.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            states[f"cuda.{i}"] = s
    return states


def set_rng_states(states: dict[str, torch.Tensor]) -> None:
    torch.random.set_rng_state(states["cpu"])
    cuda = [states[k] for k in sorted(states) if k.startswith("cuda.")]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda[: torch.cuda.device_count()])


_AUTOCAST_DEVICES = ("cpu", "cuda")


def autocast_state() -> dict[str, str]:
    """The ``torch.autocast`` regions active now: device type -> dtype name."""
    active = {}
    for device in _AUTOCAST_DEVICES:
        if torch.is_autocast_enabled(device):
            active[device] = str(torch.get_autocast_dtype(device)).removeprefix("torch.")
    return active


def autocast_regions(state: dict[str, str]) -> contextlib.ExitStack:
    """Enter the recorded autocast regions again (a context manager)."""
    stack = contextlib.ExitStack()
    for device, dtype in state.items():
        stack.enter_context(torch.autocast(device, dtype=parse_dtype(dtype)))
    return stack


@dataclass
class CapturedCall:
    """Everything the tracer took from the call, until :func:`~modulelens.capture.artifact.save_capture`
    stores it. ``weights`` are CPU copies of the parameters and buffers before the call (those
    stored; ``weight_specs`` has every one, shape-only ones with statistics)."""

    module: nn.Module
    module_path: str
    call_index: int
    inputs_sink: TensorSink
    args_spec: Any
    kwargs_spec: Any
    outputs_sink: TensorSink
    outputs_spec: Any
    weights: dict[str, torch.Tensor]
    weight_specs: dict[str, dict[str, Any]]
    rng: dict[str, torch.Tensor]
    training: bool
    grad_enabled: bool
    unrecorded: list[UnrecordedField]  # inputs, outputs and constructor arguments
    forward_seconds: float
    program: Any = None
    export_error: str | None = None
    export_seconds: float = 0.0
    grad_output: list[torch.Tensor | None] | None = None
    grad_input: list[torch.Tensor | None] | None = None
    param_grads: dict[str, torch.Tensor] = field(default_factory=dict)
    backward_notes: list[str] = field(default_factory=list)
    calls_after_capture: int = 0
    init_spec: ModuleSpec | None = None
    init_sink: TensorSink = field(default_factory=lambda: TensorSink("init."))
    attributes: dict[str, dict[str, Any]] = field(default_factory=dict)
    state_sink: TensorSink = field(default_factory=TensorSink)  # inputs and buffers the forward changed
    returned_keys: list[str] = field(default_factory=list)  # what the exported LeafCall returns
    custom_ops: dict[str, list[str]] = field(default_factory=dict)  # program's custom operators -> modules
    activations: ActivationStorage | None = None
    weights_storage: WeightStorage | None = None
    autocast: dict[str, str] = field(default_factory=dict)  # device type -> dtype of enabled autocast
    notes: list[str] = field(default_factory=list)
    gradients_by_rerun: bool = False  # input and parameter gradients come from running the module again

    @property
    def weights_shape_only(self) -> set[str]:
        return {name for name, spec in self.weight_specs.items() if not spec.get("stored", True)}


def call_input(spec: TensorSpec, stored: torch.Tensor | None, as_in_run: bool = True,
               leaves: dict[int, torch.Tensor] | None = None) -> torch.Tensor:
    """An input tensor to call the module with: a copy of its snapshot, or an uninitialised tensor
    of its shape when it was kept shape-only (export needs shapes and dtypes, not values). With
    ``as_in_run``, an input that was an activation in the run is given as one (a clone of a leaf
    that requires grad; ``leaves`` gets the leaf by the clone's id); else as a leaf (what an
    exported LeafCall takes: it clones it inside)."""
    dtype = parse_dtype(spec.dtype)
    t = stored.to(spec.device, copy=True) if stored is not None else torch.empty(spec.shape, dtype=dtype, device=spec.device)
    if not (spec.requires_grad and t.is_floating_point()):
        return t
    t.requires_grad_(True)
    if not (as_in_run and not spec.leaf):
        return t
    given = t.clone()
    if leaves is not None:
        leaves[id(given)] = t
    return given


def load_buffers(module: nn.Module, values: dict[str, torch.Tensor]) -> None:
    """Copy ``values`` (by qualified name) into ``module``'s buffers of those names."""
    with torch.no_grad():
        for name, b in module.named_buffers():
            if name in values:
                b.copy_(values[name])


def stats_specs(args: tuple, kwargs: dict) -> tuple[Any, Any, TensorSink]:
    """The inputs encoded shape-only with statistics (full shapes): kept for the case the module
    turns out not to treat batch rows independently."""
    sink = TensorSink("", 0)
    enc = Encoder(sink)
    return enc.encode(list(args), "args"), enc.encode(dict(kwargs), "kwargs"), sink
