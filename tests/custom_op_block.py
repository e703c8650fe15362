"""A module whose forward calls the custom operator of custom_op_lib.py, which this module imports
(as a model imports its package's kernels)."""

import torch
import torch.nn as nn

import custom_op_lib  # noqa: F401 - registers torch.ops.mltest.scaled_tanh


class ScaledTanhBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mltest.scaled_tanh(self.proj(x), 1.5)
