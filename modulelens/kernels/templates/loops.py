"""Loop nests over (possibly broadcast, possibly strided) operands, as index expressions for the
generated C++ and Python code."""

from __future__ import annotations

import math

from modulelens.kernels.templates.call import NoMatch, TArg


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def broadcast_strides(t: TArg, out_shape: tuple[int, ...]) -> list[int]:
    nd, pad = len(out_shape), len(out_shape) - t.ndim
    if pad < 0:
        raise NoMatch(f"operand of shape {list(t.shape)} does not broadcast to {list(out_shape)}")
    strides = []
    for d in range(nd):
        if d < pad:
            strides.append(0)
            continue
        size, stride = t.shape[d - pad], t.stride[d - pad]
        if size == out_shape[d]:
            strides.append(stride if size != 1 else 0)
        elif size == 1:
            strides.append(0)
        else:
            raise NoMatch(f"operand of shape {list(t.shape)} does not broadcast to {list(out_shape)}")
    return strides


def loop_nest(out: TArg, operand_strides: list[list[int]]) -> list[tuple[int, list[int]]]:
    """Loops (size, [output stride, operand strides...]) from outer to inner, in the output's memory
    order, with adjacent loops merged where every tensor allows it. The output must be dense."""
    nd = out.ndim
    dims = [d for d in range(nd) if out.shape[d] != 1]
    dims.sort(key=lambda d: out.stride[d], reverse=True)
    merged: list[tuple[int, list[int]]] = []
    for d in dims:
        size, st = out.shape[d], [out.stride[d], *[s[d] for s in operand_strides]]
        if merged and all(a == b * size for a, b in zip(merged[-1][1], st)):
            merged[-1] = (merged[-1][0] * size, st)
        else:
            merged.append((size, st))
    if not merged:
        merged = [(1, [1, *[0 for _ in operand_strides]])]
    expect = 1
    for size, st in reversed(merged):
        if st[0] != expect and size > 1:
            raise NoMatch(f"the eager output layout (strides {list(out.stride)}) is not dense")
        expect *= size
    return merged


def outer_loop_dims(out: TArg, operand_strides: list[list[int]]) -> list[int]:
    """The output dimensions :func:`loop_nest` merges into its outermost loop (in memory order): the
    index expressions never bound that loop, so its length may change at run time."""
    dims = sorted((d for d in range(out.ndim) if out.shape[d] != 1), key=lambda d: out.stride[d], reverse=True)
    group: list[int] = []
    for d in dims:
        st = [out.stride[d], *[s[d] for s in operand_strides]]
        if group:
            prev = [out.stride[group[-1]], *[s[group[-1]] for s in operand_strides]]
            if not all(a == b * out.shape[d] for a, b in zip(prev, st)):
                break
        group.append(d)
    return group


def offset_terms(loops: list[tuple[int, list[int]]], k: int, index: str, outer_only: bool) -> list[str]:
    """C/Python expressions (one per loop with a non-zero stride) whose sum is operand ``k``'s element
    offset for the linear ``index`` over the loops (all loops, or all but the innermost)."""
    use = loops[:-1] if outer_only else loops
    terms = []
    for j, (size, st) in enumerate(use):
        stride = st[k]
        if stride == 0 or size == 1:
            continue
        inner = math.prod(s for s, _ in use[j + 1:])
        q = index if inner == 1 else f"({index} / {inner})"
        if j > 0:
            q = f"({q} % {size})"
        terms.append(q if stride == 1 else f"{q} * {stride}")
    return terms
