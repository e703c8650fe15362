"""Inputs for checking a candidate: the tensors inside a value, and fresh random inputs shaped
like a captured sample (several seeds and distributions: normal, uniform, heavy-tailed, special
values)."""

from __future__ import annotations

from typing import Any

import torch

from modulelens.capture.values import flatten


def tensors(x: Any) -> list[torch.Tensor]:
    """The tensors in ``x`` (nested lists, tuples and dicts flattened), in order."""
    return [t for t in flatten(x) if isinstance(t, torch.Tensor)]



def fresh_inputs(args: list, kwargs: dict, seed: int, dist: str) -> tuple[list, dict]:
    """Random inputs like the sample: same shapes, dtypes, strides; floating tensors redrawn."""
    g = torch.Generator().manual_seed(seed)

    def draw(t: torch.Tensor) -> torch.Tensor:
        if not t.is_floating_point():
            return t.clone()
        shape = tuple(t.shape)
        if dist == "normal":
            x = torch.randn(shape, generator=g, dtype=torch.float64)
        elif dist == "uniform":
            x = torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1
        elif dist == "heavy":
            x = torch.empty(shape, dtype=torch.float64).cauchy_(generator=g).clamp_(-1e4, 1e4)
        else:  # special values sprinkled over a normal background
            x = torch.randn(shape, generator=g, dtype=torch.float64)
            specials = torch.tensor([0.0, -0.0, 1e4, -1e4, 1e-30, -1e-30, 1.0, -1.0], dtype=torch.float64)
            mask = torch.rand(shape, generator=g) < 0.05
            picks = specials[torch.randint(0, len(specials), shape, generator=g)]
            x = torch.where(mask, picks, x)
        out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
        out.copy_(x.to(t.dtype))
        return out

    new_args = [draw(a) if isinstance(a, torch.Tensor) else a for a in args]
    new_kwargs = {k: draw(v) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    return new_args, new_kwargs
