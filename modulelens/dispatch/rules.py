"""Guards by shape rule: whether a live call fits an entry's checked shape rule, and if not, why.

An entry whose kernel was validated with a shape rule (:mod:`modulelens.kernels.shape_rules`)
admits a call that differs from its validated call only in the rule's variable dimensions: each
between 1 and the largest size validation checked, dimensions that share a size equal, and the
tensors holding them contiguous. Everything else (mode, training flag, the other dimensions,
dtypes, devices, the strides of other tensors, non-tensor arguments) must be as validated. The
guard works on call keys (:func:`modulelens.dispatch.patterns.call_key`), so it runs only on the
miss path of the exact lookup, and the runtime remembers the keys it admitted.
"""

from __future__ import annotations

from typing import Any

from modulelens.capture import dtype_name
from modulelens.dispatch.patterns import GRAD_OFF, INFERENCE, difference, value_difference
from modulelens.kernels import ShapeRule


def _is_contiguous(shape: Any, stride: Any) -> bool:
    expected = 1
    for size, st in zip(reversed(tuple(shape)), reversed(tuple(stride))):
        if size != 1 and st != expected:
            return False
        expected *= size
    return True


class RuleGuard:
    """The guard of one entry with a checked rule, against its validated call key."""

    def __init__(self, validated: tuple, rule: ShapeRule):
        self.validated = validated
        self.rule = rule
        self.variable: dict[int, dict[int, int]] = {}  # position -> dimension -> index of its variable dim
        for i, d in enumerate(rule.dims):
            for pos, dim in d.at:
                self.variable.setdefault(pos, {})[dim] = i
        self.max_size = [d.max_size for d in rule.dims]

    def why_not(self, key: tuple) -> str | None:
        """None when the call of ``key`` fits the rule, else the first thing that does not."""
        mode, training, args, kwargs = key
        v_mode, v_training, v_args, v_kwargs = self.validated
        if (mode != v_mode and not (mode == INFERENCE and v_mode == GRAD_OFF)) or training != v_training:
            return difference(key, self.validated)
        if len(args) != len(v_args) or [k for k, _ in kwargs] != [k for k, _ in v_kwargs]:
            return "different arguments given"
        names = [f"argument {i}" for i in range(len(args))] + [f"argument {k}" for k, _ in kwargs]
        got = [*args, *(v for _, v in kwargs)]
        want = [*v_args, *(v for _, v in v_kwargs)]
        sizes: dict[int, int] = {}
        for pos, (where, g, w) in enumerate(zip(names, got, want)):
            dims = self.variable.get(pos)
            problem = value_difference(where, g, w) if dims is None else self._tensor(where, g, w, dims, sizes)
            if problem:
                return problem
        return None

    def _tensor(self, where: str, got: Any, want: tuple, dims: dict[int, int], sizes: dict[int, int]) -> str | None:
        if got[0] != "T":
            return value_difference(where, got, want)
        _, shape, stride, dtype, device = got
        if dtype != want[3]:
            return f"{where}: dtype {dtype_name(dtype)} (validated: {dtype_name(want[3])})"
        if device != want[4]:
            return f"{where}: device {device} (validated: {want[4]})"
        if len(shape) != len(want[1]):
            return f"{where}: {len(shape)} dimensions (validated: {len(want[1])})"
        for d, (size, fixed) in enumerate(zip(shape, want[1])):
            i = dims.get(d)
            if i is None:
                if size != fixed:
                    return f"{where}: shape {list(shape)}, dimension {d} is {size} (validated: {fixed}; not variable)"
                continue
            if not 1 <= size <= self.max_size[i]:
                return (f"{where}: shape {list(shape)}, dimension {d} is {size}, outside the shape rule "
                        f"(checked 1..{self.max_size[i]})")
            if sizes.setdefault(i, size) != size:
                return f"{where}: dimension {d} is {size}, but it shares its size with a dimension of {sizes[i]}"
        if not _is_contiguous(shape, stride):
            return f"{where}: strides {list(stride)} not contiguous (the shape rule takes contiguous tensors)"
        return None
