"""A custom operator registered with torch.library, as a user's extension package would: the
capture tests check that a program calling it loads in a fresh process (see custom_op_block.py)."""

import torch

_LIB = torch.library.Library("mltest", "DEF")
_LIB.define("scaled_tanh(Tensor x, float scale) -> Tensor")


def _scaled_tanh(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.tanh(x) * scale


def _scaled_tanh_fake(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.empty_like(x)


_LIB.impl("scaled_tanh", _scaled_tanh, "CompositeExplicitAutograd")
_LIB.impl("scaled_tanh", _scaled_tanh_fake, "Meta")
