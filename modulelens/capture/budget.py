"""The byte budget of a capture, and batch-sliced capture when a call's activations exceed it.

A capture stores the call's inputs and outputs (its *activations*) in full while they total at
most the budget (:data:`DEFAULT_CAPTURE_BYTES`, sized for a laptop disk). Above it, when the module
treats the rows of its batch independently, only the first rows are kept: the module is run again
on the first rows of the inputs (from the pre-call RNG and buffer state) and that output must match
the same rows of the real output within the dtype's tolerance. The stored inputs, outputs and state
are then those of the sliced run, so replay and kernel validation are exact on the slice. Otherwise
(BatchNorm in training mode, outputs without the batch dimension, ...) tensors are stored
shape-only with statistics.

The batch dimension is dimension 0; its size is that of the first input tensor. Input and output
tensors whose dimension 0 has that size are sliced; others are kept whole.
"""

from __future__ import annotations

from typing import Any

import torch

from modulelens.capture.values import TensorSink

DEFAULT_CAPTURE_BYTES = 2 * 1024**3
"""Activations a capture stores in full by default (inputs and outputs together): 2 GiB."""


def tensors_bytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def batch_size(tensors: list[torch.Tensor]) -> int | None:
    """The size of dimension 0 of the first tensor (None when there is no tensor with a dimension)."""
    first = next((t for t in tensors if t.dim() >= 1), None)
    return None if first is None else int(first.shape[0])


def rows_within(batch: int, total_bytes: int, budget: int) -> int:
    """How many of ``batch`` rows fit the budget when the whole batch takes ``total_bytes`` (at
    least 1, fewer than the batch)."""
    return max(1, min(batch - 1, batch * budget // max(total_bytes, 1)))


def is_batched(t: torch.Tensor, batch: int) -> bool:
    return t.dim() >= 1 and t.shape[0] == batch


class SliceSink(TensorSink):
    """A sink that keeps the first ``rows`` rows of tensors whose dimension 0 is ``batch`` (copies of
    those rows only) and whole copies of the others; ``sliced`` lists the keys it cut."""

    def __init__(self, rows: int, batch: int, max_bytes: int | None = None):
        super().__init__("", max_bytes)
        self.rows, self.batch = rows, batch
        self.sliced: set[str] = set()

    def add(self, key: str, t: torch.Tensor) -> dict[str, Any]:
        if is_batched(t, self.batch):
            self.sliced.add(self.prefix + key)
            t = t.detach()[: self.rows]
        return super().add(key, t)


def first_rows(tensors: dict[str, torch.Tensor], batched: set[str], rows: int) -> dict[str, torch.Tensor]:
    """The tensors by key with the batched ones cut to their first ``rows`` rows."""
    return {k: (t[:rows] if k in batched else t) for k, t in tensors.items()}
