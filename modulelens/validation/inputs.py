"""Inputs for checking a candidate: the tensors inside a value, fresh random inputs shaped like a
captured sample (several seeds and distributions: normal, uniform, heavy-tailed, special values),
and fresh parameters and buffers for a module (:func:`fresh_state`).

Values are drawn chunk by chunk (:data:`~modulelens.numerics.CHUNK_ELEMENTS` elements at a time,
in float64), so a 256 MiB input costs one float64 chunk beyond itself, not a float64 copy."""

from __future__ import annotations

import math
from typing import Any

import torch

from modulelens.capture import flatten
from modulelens.numerics import CHUNK_ELEMENTS


def tensors(x: Any) -> list[torch.Tensor]:
    """The tensors in ``x`` (nested lists, tuples and dicts flattened), in order."""
    return [t for t in flatten(x) if isinstance(t, torch.Tensor)]


def _values(n: int, dist: str, g: torch.Generator) -> torch.Tensor:
    """``n`` float64 values of distribution ``dist`` (one chunk)."""
    if dist == "normal":
        return torch.randn(n, generator=g, dtype=torch.float64)
    if dist == "uniform":
        return torch.rand(n, generator=g, dtype=torch.float64) * 2 - 1
    if dist == "heavy":
        return torch.empty(n, dtype=torch.float64).cauchy_(generator=g).clamp_(-1e4, 1e4)
    # special values sprinkled over a normal background
    x = torch.randn(n, generator=g, dtype=torch.float64)
    specials = torch.tensor([0.0, -0.0, 1e4, -1e4, 1e-30, -1e-30, 1.0, -1.0], dtype=torch.float64)
    mask = torch.rand(n, generator=g) < 0.05
    picks = specials[torch.randint(0, len(specials), (n,), generator=g)]
    return torch.where(mask, picks, x)


def _drawn_like(t: torch.Tensor, make) -> torch.Tensor:
    """A tensor with ``t``'s shape, strides, dtype and device whose values ``make(start, n)``
    gives chunk by chunk (float64, cast to ``t``'s dtype)."""
    flat = torch.empty(t.numel(), dtype=t.dtype)
    for start in range(0, t.numel(), CHUNK_ELEMENTS):
        n = min(CHUNK_ELEMENTS, t.numel() - start)
        flat[start:start + n] = make(start, n).to(t.dtype)
    out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    out.copy_(flat.view(t.shape))
    return out


def fresh_inputs(args: list, kwargs: dict, seed: int, dist: str) -> tuple[list, dict]:
    """Random inputs like the sample: same shapes, dtypes, strides; floating tensors redrawn."""
    g = torch.Generator().manual_seed(seed)

    def draw(t: torch.Tensor) -> torch.Tensor:
        if not t.is_floating_point():
            return t.clone()
        return _drawn_like(t, lambda start, n: _values(n, dist, g))

    new_args = [draw(a) if isinstance(a, torch.Tensor) else a for a in args]
    new_kwargs = {k: draw(v) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    return new_args, new_kwargs


def floating_names(args: list, kwargs: dict, names: list[str] | None = None) -> list[str]:
    """The names (``names[i]`` for positional ``i`` when given, else ``argument i``; keywords by
    name) of the floating tensor arguments :func:`fresh_inputs` redraws."""
    out = [names[i] if names and i < len(names) else f"argument {i}"
           for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.is_floating_point()]
    return out + [k for k, v in kwargs.items() if isinstance(v, torch.Tensor) and v.is_floating_point()]


# -- fresh parameters and buffers ----------------------------------------------------------------

FRESH_STATE = ("parameters: N(0, s^2) per element, s the captured tensor's RMS (1 for an all-zero one): random "
               "signs and scales, non-trivial affine weights, non-zero biases; floating buffers likewise, but "
               "s*U(0.25, 2) for buffers with no negative value (variances stay positive); buffers holding only "
               "0, 1 and infinities (masks) and integer tensors kept; tensors shared under several names get one "
               "value")


def _rms(t: torch.Tensor) -> float:
    flat = t.detach().reshape(-1)
    sq = sum(float(flat[i:i + CHUNK_ELEMENTS].double().square().sum()) for i in range(0, flat.numel(), CHUNK_ELEMENTS))
    return math.sqrt(sq / max(flat.numel(), 1))


def _is_mask(t: torch.Tensor) -> bool:
    """Holds only 0, 1 and infinities, at least two of them: a mask, not a learned value."""
    flat = t.detach().reshape(-1)[:CHUNK_ELEMENTS].double()
    mask = (flat == 0) | (flat == 1) | torch.isinf(flat)
    return bool(mask.all()) and flat.unique().numel() >= 2


def fresh_state(state: dict[str, torch.Tensor], parameters: set[str],
                seed: int) -> tuple[dict[str, torch.Tensor], list[str], list[str]]:
    """A state dict like ``state`` with floating parameters and buffers drawn afresh (see
    :data:`FRESH_STATE`; ``parameters``: which names are parameters). Returns (state, names
    varied, names kept as ``name (why)``)."""
    g = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    varied, kept = [], []
    shared: dict[tuple[int, tuple, torch.dtype], torch.Tensor] = {}
    for name, t in state.items():
        if not t.is_floating_point() or t.numel() == 0:
            out[name] = t
            if t.numel():
                kept.append(f"{name} (not floating)")
            continue
        key = (t.data_ptr(), tuple(t.shape), t.dtype)
        if key in shared:
            out[name] = shared[key]
            varied.append(name)
            continue
        buffer = name not in parameters
        if buffer and (_is_mask(t) or not bool(torch.isfinite(t).all())):
            out[name] = t
            kept.append(f"{name} (a mask or holds non-finite values)")
            continue
        scale = _rms(t) or 1.0
        positive = buffer and bool((t >= 0).all())

        def draw(start: int, n: int, scale: float = scale, positive: bool = positive) -> torch.Tensor:
            if positive:  # variances and the like stay positive
                return scale * (0.25 + 1.75 * torch.rand(n, generator=g, dtype=torch.float64))
            return scale * torch.randn(n, generator=g, dtype=torch.float64)

        new = _drawn_like(t, draw)
        shared[key] = out[name] = new
        varied.append(name)
    return out, varied, kept
