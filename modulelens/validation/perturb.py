"""Inputs that change between the calls of a timed batch, the same way on both sides.

A timed batch calls the candidate ``calls`` times. If every call saw the same inputs, a candidate
could compute once and return a cached result for the rest (keyed on a few sampled values, or on
nothing at all) and the batch would time a cache. So before every call after the first, the
harness swaps two elements of every floating-point input: element ``p`` with element
``p + n/2`` (mod ``n``, ``n`` the elements the input spans), ``p`` stepping through the input
from a per-batch seed (:class:`Swaps`). A swap moves values between distant positions (usually
different rows), so a result computed before it is wrong after it for elementwise operators,
normalisations and reductions alike; it exchanges bit patterns, so it is exact for every dtype;
it costs a few hundred nanoseconds per input (the same in the reference's process, whose batches
run the same code). The checker replays the same swaps on its own copy of the batch's inputs
(:func:`replay`) and checks the candidate's outputs of sampled batches against the reference
on those final inputs.

Used by the harness (on the shared arena, through memoryviews) and by the checker (on numpy
views of its copies): both call the same :class:`Swaps`.
"""

from __future__ import annotations

import math
from typing import Any

_FORMATS = {1: "B", 2: "H", 4: "I", 8: "Q"}  # memoryview item formats by element size


def _step(seed: int, n: int) -> tuple[int, int]:
    """(start, step) of the positions for ``n`` elements, both spread by a multiplicative hash of
    the seed: step coprime with ``n``, so the first ``n`` positions are all different, and rarely
    small, so consecutive swaps land in different rows."""
    mixed = (seed * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) % (1 << 64)
    start = mixed % n
    step = (mixed >> 32) % n or 1
    while math.gcd(step, n) != 1:
        step += 1
    return start, step


class Swaps:
    """The swaps of one batch over ``spans`` (sequences of ints or numpy integer arrays, one per
    floating input, each the input's whole storage span), from ``seed``. ``swaps(i)`` performs
    the swaps that precede call ``i`` (1, 2, ...)."""

    def __init__(self, spans: list[Any], seed: int):
        self.items = []
        for k, seq in enumerate(spans):
            n = len(seq)
            if n >= 2:
                self.items.append((seq, n, n // 2, *_step(seed + 7919 * k, n)))

    def __call__(self, i: int) -> None:
        for seq, n, half, start, step in self.items:
            p = (start + i * step) % n
            q = (p + half) % n
            seq[p], seq[q] = seq[q], seq[p]


def item_format(element_size: int) -> str:
    """The memoryview format that moves one element of this size as an unsigned integer."""
    return _FORMATS[element_size]


def replay(tensors: list[Any], seed: int, calls: int) -> None:
    """Apply, in place, the swaps a batch of ``calls`` calls made before its last call, to
    ``tensors`` (CPU tensors laid out exactly like the arena's slots: storage offset 0, storage
    spanning the slot): the inputs the last call saw."""
    import torch

    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    spans = []
    for t in tensors:
        n = t.untyped_storage().nbytes() // t.element_size()
        flat = torch.as_strided(t, (n,), (1,), 0)
        spans.append(flat.view(ints[t.element_size()]).numpy())
    swaps = Swaps(spans, seed)
    for i in range(1, calls):
        swaps(i)


def perturbed(t: Any) -> bool:
    """Whether a batch's swaps touch this input: a floating-point tensor of two elements or more
    whose elements fill its span exactly (no gaps between them, none shared), so that every
    swapped element is one the call reads and both sides see the same bytes."""
    from modulelens.sandbox import span_bytes

    return t.is_floating_point() and t.numel() > 1 and span_bytes(t) == t.numel() * t.element_size()
