"""Profile what a reference names: a capture (one forward of the rebuilt module) or an operator
card (its op on the first stored sample).

Both run here, with a torch.profiler breakdown and peak memory on request. Memory-bound cards get a
roofline: achieved bytes per second against this machine's measured copy bandwidth. Candidate
kernels are untrusted code, timed only in a sandbox worker: the ``profile`` tool sends them to
:mod:`modulelens.validation` and describes the timing with :class:`ProfileResult` and
:func:`add_roofline` from here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from pydantic import BaseModel, Field

from modulelens.callbacks import ProgressFn
from modulelens.capture import KIND as CAPTURES
from modulelens.capture import LoadedCapture, capture_manifest
from modulelens.device import require
from modulelens.listing import LeftOut
from modulelens.ops import OpCard, is_card_id, open_card, require_tensor_inputs, run_card, sample_call
from modulelens.profiling.bandwidth import copy_bandwidth
from modulelens.profiling.breakdown import OpTime, profile_breakdown
from modulelens.replies import ToolReply
from modulelens.repo import Repository
from modulelens.timing import Timing, time_callable


class ProfileOptions(BaseModel):
    """How to profile (the profile tool's request extends this)."""

    device: str | None = Field(None, description="Default: the captured one.")
    min_run_time: float = Field(0.5, gt=0, description="Seconds of timed calls.")
    warmup: int = Field(3, ge=0, description="Untimed calls first.")
    breakdown: bool = Field(True)
    strategy: str = Field("auto")


class ProfileResult(Timing, ToolReply):
    target: str
    target_kind: str = Field(description="capture, card or candidate.")
    what: str = Field(description="What one timed call does.")
    grad_enabled: bool = Field(description="Whether autograd recorded during the timed calls.")
    breakdown: list[OpTime] | None = None
    peak_memory_bytes: int | None = None
    peak_memory_method: str | None = None
    bytes_moved: int | None = Field(None, description="Bytes read + written per call (memory-bound cards).")
    achieved_bytes_per_s: float | None = None
    copy_bytes_per_s: float | None = Field(None, description="This machine's measured copy bandwidth (cached per machine).")
    roofline_fraction: float | None = Field(None, description="achieved / copy bandwidth; above 1 means the data sat in cache.")
    notes: list[str] = Field(default_factory=list)
    left_out: list[LeftOut] = Field(default_factory=list, description="Lists cut to `limit` items.")


@dataclass
class _Timed:
    """A call to time here, and what the result should say about it."""

    call: Callable[[], Any]
    device: str
    what: str
    grad: bool
    card: OpCard | None = None
    notes: list[str] = field(default_factory=list)
    setup: Callable[[], Any] | None = None  # runs before every call, untimed


def _no_progress(done: float, total: float | None = None, message: str | None = None) -> None:
    pass


def profile_target(repo: Repository, target: str, options: ProfileOptions,
                   progress: ProgressFn = _no_progress) -> ProfileResult:
    """Time ``target`` (a capture reference or a card id) and explain the numbers."""
    kind = "card" if is_card_id(target) else "capture"
    timed = _card_call(repo, target, options) if kind == "card" else _capture_call(repo, target, options)
    progress(0, 3, f"timing {target}")
    timing = time_callable(timed.call, timed.device, min_run_time=options.min_run_time, warmup=options.warmup,
                           setup=timed.setup)
    result = ProfileResult(**timing.model_dump(), target=target, target_kind=kind, what=timed.what,
                           grad_enabled=timed.grad, notes=timed.notes)
    if options.breakdown:
        progress(1, 3, "torch.profiler breakdown")
        result.breakdown, result.peak_memory_bytes, result.peak_memory_method = profile_breakdown(
            timed.call, timed.device, setup=timed.setup)
    if timed.card is not None:
        if timed.card.kind == "memory" and timed.card.bytes_per_call:
            progress(2, 3, "machine copy bandwidth")
            add_roofline(result, timed.card, timed.device)
            if result.roofline_fraction > 1:
                result.notes.append("achieved bandwidth exceeds the memory copy bandwidth: the working set "
                                    f"({timed.card.bytes_per_call} bytes) fits in cache")
        elif timed.card.kind == "compute":
            result.notes.append("compute-bound operator: a bandwidth roofline does not apply")
    progress(3, 3, "done")
    return result


def _on(device: str | None, default: str) -> str:
    return require(device or default)


def _synthesized_notes(synthesized: Any) -> list[str]:
    return ["some inputs were synthesised from stored statistics (shape-only capture)"] if synthesized else []


def _card_call(repo: Repository, card_id: str, options: ProfileOptions) -> _Timed:
    art, card = open_card(repo, card_id)
    require_tensor_inputs(card)
    device = _on(options.device, card.device)
    args, kwargs, _, synthesized = sample_call(art, card, 0, device=device)
    args = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]

    def call():
        with torch.no_grad():
            return run_card(card, args, kwargs)

    return _Timed(call, device, f"one call of {card.op} on the card's first stored sample (no autograd)", False,
                  card=card, notes=_synthesized_notes(synthesized))


def _capture_call(repo: Repository, ref: str, options: ProfileOptions) -> _Timed:
    art = repo.open(CAPTURES, ref)
    m = capture_manifest(art)
    device = _on(options.device, m.environment.device)
    loaded = LoadedCapture(art, device=device)
    inputs = [loaded.inputs()]
    module, strategy, _, _ = loaded.with_strategy(options.strategy, False, lambda mod: mod)

    def call():
        args, kwargs = inputs[0]
        with torch.set_grad_enabled(m.grad_enabled):
            return module(*args, **kwargs)

    def rebuild() -> None:
        inputs[0] = loaded.inputs()

    what = (f"one forward of {m.class_path} ({strategy} strategy) on the captured inputs, "
            f"in {'train' if m.training else 'eval'} mode")
    changed = loaded.changed_inputs
    if changed:  # each call starts from the inputs as captured (a cache not yet grown by the last call)
        what += f"; the inputs are rebuilt before every call, untimed (the forward changes {', '.join(changed[:3])})"
    return _Timed(call, device, what, m.grad_enabled, notes=_synthesized_notes(loaded.synthesized),
                  setup=rebuild if changed else None)


def add_roofline(result: ProfileResult, card: OpCard, device: str) -> None:
    """Add to ``result`` (one call of memory-bound ``card`` timed on ``device``) the bytes it moves,
    the bandwidth achieved and its fraction of this machine's copy bandwidth."""
    bw = copy_bandwidth(device)
    result.bytes_moved = card.bytes_per_call
    result.achieved_bytes_per_s = card.bytes_per_call / result.median_s
    result.copy_bytes_per_s = bw["bytes_per_s"]
    result.roofline_fraction = result.achieved_bytes_per_s / bw["bytes_per_s"]
