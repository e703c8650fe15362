"""The call an operator card describes, as the templates see it: tensors as :class:`TArg` (shape,
dtype, strides, device), torch constants as :class:`Const`, plain values as themselves, and the
entry point's parameter names (the aten schema's, made safe for C++ and Python).

:func:`decode` reads the stored sample's value specs (format: :mod:`modulelens.capture.spec`).
"""

from __future__ import annotations

import keyword
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from modulelens.capture import SpecVisitor, TensorSpec, ValueKind, mapping_items
from modulelens.kernels.source import CPP_KEYWORDS
from modulelens.ops import OpCard, as_card, resolve_op


class NoMatch(Exception):
    """The card's operator belongs to a family, but its arguments are outside what the template covers."""


@dataclass(frozen=True)
class TArg:
    """A tensor argument or output as the card's sample describes it."""

    shape: tuple[int, ...]
    dtype: str
    stride: tuple[int, ...]
    contiguous: bool
    device: str

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)


@dataclass(frozen=True)
class Const:
    """A torch constant argument: ``kind`` is ``dtype`` or ``torch`` (memory format, layout)."""

    kind: str
    name: str


@dataclass
class Call:
    op: str
    args: list[Any]
    kwargs: dict[str, Any]
    outputs: list[TArg]
    names: list[str] = field(default_factory=list)  # entry-point parameter names, in order
    schema_names: list[str] = field(default_factory=list)  # aten argument names of the values, in order

    @property
    def values(self) -> list[Any]:
        return [*self.args, *self.kwargs.values()]

    @property
    def tensors(self) -> list[TArg]:
        return [v for v in self.values if isinstance(v, TArg)]

    @property
    def base(self) -> str:
        """``gelu`` for ``aten.gelu.default``."""
        return self.op.split(".")[1]

    def arg(self, name: str, default: Any = None) -> Any:
        if name in self.schema_names:
            return self.values[self.schema_names.index(name)]
        return default

    def param(self, name: str) -> str:
        """The entry point's parameter name for an aten argument name."""
        return self.names[self.schema_names.index(name)]


class _CallDecoder(SpecVisitor[Any]):
    """A stored value spec as the templates see it: tensors as :class:`TArg`, lists, tuples and
    sizes as lists, torch constants as :class:`Const`, plain values as themselves. Any other kind
    is outside what a template covers (:class:`NoMatch`)."""

    def scalar(self, value: Any) -> Any:
        return value

    def tensor(self, spec: TensorSpec) -> TArg:
        if spec.layout:
            raise NoMatch(f"tensor layout {spec.layout} (templates take strided tensors)")
        shape = tuple(spec.shape)
        stride = tuple(spec.stride) if spec.stride is not None else _contiguous(shape)
        return TArg(shape, spec.dtype, stride, spec.contiguous, spec.device)

    def sequence(self, kind: ValueKind, items: list[Any], cls: str | None) -> list[Any]:
        return [self.visit(x) for x in items]

    def size(self, dims: list[int]) -> list[int]:
        return list(dims)

    def nonfinite_float(self, text: str) -> float:
        return float(text)

    def dtype(self, name: str) -> Const:
        return Const("dtype", name)

    def torch_constant(self, name: str) -> Const:
        return Const("torch", name)

    def device(self, name: str) -> Const:
        return Const("device", name)

    def unsupported(self, kind: ValueKind, spec: dict[str, Any]) -> Any:
        raise NoMatch(f"argument of kind {kind.value!r}")

    def unknown_kind(self, kind: str, spec: dict[str, Any]) -> Any:
        raise NoMatch(f"argument of kind {kind!r}")

    def malformed(self, spec: Any, why: str) -> Any:
        raise NoMatch(f"argument {spec!r}")


def decode(spec: Any) -> Any:
    """The templates' view of one stored value spec (see :class:`_CallDecoder`); :class:`NoMatch`
    for a value no template takes."""
    return _CallDecoder().visit(spec)


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(out))


def contiguous_strides(shape) -> tuple[int, ...]:
    return _contiguous(tuple(shape))


def _flat_outputs(value: Any) -> list[TArg]:
    if isinstance(value, TArg):
        return [value]
    if isinstance(value, list):
        return [t for v in value for t in _flat_outputs(v)]
    return []


def _safe_name(name: str) -> str:
    name = "".join(c if c.isalnum() or c == "_" else "_" for c in name) or "arg"
    if name[0].isdigit():
        name = "a" + name
    if keyword.iskeyword(name) or name in CPP_KEYWORDS:
        name += "_"
    return name


def call_from_card(card: OpCard | Mapping[str, Any]) -> Call:
    """The call of the card's first stored sample: positional args, then keyword args in stored order."""
    card = as_card(card)
    if not card.samples:
        raise NoMatch("the card has no stored sample to take the call's structure from")
    s = card.samples[0]
    args = decode(s.args)
    kwargs = {k: decode(v) for k, v in mapping_items(s.kwargs)}
    outputs = _flat_outputs(decode(s.output))
    schema_names = _schema_names(card.op, len(args)) + list(kwargs)
    names, seen = [], set()
    for n in schema_names:
        n = _safe_name(n)
        while n in seen:
            n += "_"
        seen.add(n)
        names.append(n)
    return Call(op=card.op, args=list(args), kwargs=kwargs, outputs=outputs, names=names, schema_names=schema_names)


def _schema_names(op: str, n: int) -> list[str]:
    try:
        arguments = resolve_op(op)._schema.arguments
        names = [a.name for a in arguments[:n]]
    except (AttributeError, RuntimeError, ValueError):
        names = []
    return names + [f"arg{i}" for i in range(len(names), n)]


def dense(name: str, contiguous: bool) -> str:
    """Source text (C++ or Python alike) reading tensor parameter ``name`` densely: the name, or
    ``name.contiguous()`` when the card's tensor was not contiguous."""
    return name if contiguous else f"{name}.contiguous()"


def dense_operands(names: list[str | None], contiguous: list[bool]) -> list[str | None]:
    """:func:`dense` of each present operand (None stands for an absent optional one), taking the
    flags of ``contiguous`` in order for the present ones."""
    flags = iter(contiguous)
    return [None if n is None else dense(n, next(flags)) for n in names]


def trailing_size(x: Any, normalized_shape: Any) -> int:
    """The element count of ``normalized_shape`` (the norm families' ``C``), after checking that
    it ends the input's shape and that nothing is empty."""
    if not isinstance(x, TArg) or not isinstance(normalized_shape, list) or not normalized_shape:
        raise NoMatch("expected a tensor input and a normalized_shape")
    k = len(normalized_shape)
    if x.ndim < k or list(x.shape[-k:]) != list(normalized_shape):
        raise NoMatch(f"normalized_shape {normalized_shape} does not end the input shape {list(x.shape)}")
    c = math.prod(normalized_shape)
    if c == 0 or x.numel == 0:
        raise NoMatch("empty input")
    return c


def require_same_device(call: Call) -> None:
    devices = {t.device.split(":")[0] for t in call.tensors}
    if len(devices) > 1:
        raise NoMatch(f"tensors on different devices ({', '.join(sorted(devices))})")


def require_dense_layout(t: TArg, what: str = "input") -> None:
    if t.numel == 0:
        raise NoMatch(f"empty {what} (shape {list(t.shape)})")


def jsonable(params: dict[str, Any]) -> dict[str, Any]:
    """``params`` with tuples as lists (what JSON gives back), for provenance and results."""
    out = {}
    for k, v in params.items():
        if isinstance(v, tuple):
            v = list(v)
        if isinstance(v, list):
            v = [list(x) if isinstance(x, tuple) else x for x in v]
        out[k] = v
    return out
