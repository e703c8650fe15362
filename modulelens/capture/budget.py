"""The byte budget of a capture: weights first, then the call's activations, batch-sliced above it.

The budget (:data:`DEFAULT_CAPTURE_BYTES`, sized for a laptop disk) covers everything a capture
stores: the module's parameters and buffers, and the call's inputs and outputs (its *activations*).

* **Weights** (:func:`snapshot_weights`) are kept whole while they fit; above the budget they are
  stored shape-only with statistics (replay makes up values of that distribution and says its
  outputs are not comparable). Stored weights take their bytes from the activations' share.
* **Activations** are stored in full while they fit what is left. Above it, when the module treats
  the rows of its batch independently, only the first rows are kept: the module is run again on
  the first rows of the inputs (from the pre-call RNG and buffer state) and that output must match
  the same rows of the real output within the dtype's tolerance. The stored inputs, outputs and
  state are then those of the sliced run, so replay and kernel validation are exact on the slice.
  Otherwise (BatchNorm in training mode, outputs without the batch dimension, ...) tensors are
  stored shape-only with statistics.

The batch dimension is found from the run (:func:`batch_candidates`): dimension 0 or 1 of the first
input tensor (batch-first or sequence-first layouts), one along which every output tensor has the
same size; dimension 0 is tried first, and the row check decides. Input and output tensors whose
size along that dimension is the batch's are sliced; others are kept whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from modulelens.capture.manifest import WeightStorage
from modulelens.capture.sharded import is_sharded, plain
from modulelens.capture.values import TensorSink

DEFAULT_CAPTURE_BYTES = 2 * 1024**3
"""What a capture stores in full by default (weights, inputs and outputs together): 2 GiB."""

BATCH_DIMS = (0, 1)
"""Dimensions that may hold the batch: batch-first and sequence-first layouts."""


def tensors_bytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def human_bytes(n: int) -> str:
    """``n`` bytes in KiB, MiB or GiB, one decimal."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n / 2**10:.1f} KiB"


# -- weights ----------------------------------------------------------------------------------

@dataclass
class WeightSnapshot:
    """The module's parameters and buffers as stored: ``sink`` holds copies (or shape-only specs
    with statistics); ``inside_call`` names sharded parameters still to be read when the forward
    starts (see :mod:`modulelens.capture.sharded`); ``stored_bytes`` is what they take of the
    budget."""

    sink: TensorSink
    storage: WeightStorage
    inside_call: list[str]
    stored_bytes: int


def snapshot_weights(module: nn.Module, budget: int, max_tensor_bytes: int | None) -> WeightSnapshot:
    """Copy ``module``'s parameters and buffers (one copy each, on the CPU) when they fit the
    budget, else keep their shapes and statistics only. Sharded parameters are left for
    :func:`~modulelens.capture.sharded.read_inside_call`."""
    params = dict(module.named_parameters())
    buffers = dict(module.named_buffers())
    total = tensors_bytes([*params.values(), *buffers.values()])
    fits = total <= budget
    sink = TensorSink("", max_tensor_bytes if fits else 0)
    inside = [n for n, p in params.items() if is_sharded(p)]
    for name, t in params.items():
        if name not in inside:
            sink.add(name, plain(t))
    for name, t in buffers.items():
        sink.add(name, plain(t))
    if fits:
        storage = WeightStorage(mode="full", total_bytes=total, budget_bytes=budget, reason="within the budget")
    else:
        storage = WeightStorage(
            mode="shape_only", total_bytes=total, budget_bytes=budget,
            reason=f"the parameters and buffers total {human_bytes(total)}, over the budget of {human_bytes(budget)}: they are "
            "stored shape-only with statistics, replay makes up values of that distribution and cannot compare "
            "outputs (raise max_capture_bytes to store them)")
    return WeightSnapshot(sink=sink, storage=storage, inside_call=inside, stored_bytes=total if fits else 0)


# -- batch slicing ----------------------------------------------------------------------------

@dataclass(frozen=True)
class BatchDim:
    """A candidate batch dimension: its index and the batch size along it."""

    dim: int
    size: int

    def holds(self, t: torch.Tensor) -> bool:
        """Whether ``t`` has the batch along this dimension."""
        return t.dim() > self.dim and t.shape[self.dim] == self.size

    def first(self, t: torch.Tensor, rows: int) -> torch.Tensor:
        return t.narrow(self.dim, 0, rows)


def batch_candidates(inputs: list[torch.Tensor], outputs: list[torch.Tensor] | None = None) -> list[BatchDim]:
    """Where the batch may be: dimension 0, then 1, of the first input tensor with a dimension, where
    its size is 2 or more and (when ``outputs`` are given) every output tensor has that size too."""
    first = next((t for t in inputs if t.dim() >= 1), None)
    if first is None:
        return []
    found = [BatchDim(d, int(first.shape[d])) for d in BATCH_DIMS if d < first.dim() and first.shape[d] >= 2]
    if outputs is not None:
        found = [b for b in found if outputs and all(b.holds(t) for t in outputs)]
    return found


def rows_within(batch: int, total_bytes: int, budget: int) -> int:
    """How many of ``batch`` rows fit the budget when the whole batch takes ``total_bytes`` (at
    least 1, fewer than the batch)."""
    return max(1, min(batch - 1, batch * budget // max(total_bytes, 1)))


class SliceSink(TensorSink):
    """A sink that keeps the first ``rows`` rows (along the batch dimension) of tensors that hold the
    batch (copies of those rows only) and whole copies of the others; ``sliced`` lists the keys it
    cut."""

    def __init__(self, rows: int, batch: BatchDim, max_bytes: int | None = None):
        super().__init__("", max_bytes)
        self.rows, self.batch = rows, batch
        self.sliced: set[str] = set()

    def add(self, key: str, t: torch.Tensor, part_of: torch.Tensor | None = None) -> dict[str, Any]:
        if self.batch.holds(t):
            self.sliced.add(self.prefix + key)
            return super().add(key, self.batch.first(t.detach(), self.rows), part_of=t)
        return super().add(key, t, part_of)


def first_rows(tensors: dict[str, torch.Tensor], batched: set[str], batch: BatchDim, rows: int) -> dict[str, torch.Tensor]:
    """The tensors by key with the batched ones cut to their first ``rows`` rows."""
    return {k: (batch.first(t, rows) if k in batched else t) for k, t in tensors.items()}
