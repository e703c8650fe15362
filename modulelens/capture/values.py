"""Serialise Python values (module inputs, outputs, constructor arguments) as JSON plus tensors.

:class:`Encoder` turns a value into a JSON-able *spec* (the format is
:mod:`modulelens.capture.spec`'s); tensors go to a :class:`TensorSink` and the spec keeps a
:class:`~modulelens.capture.spec.TensorSpec` (key, shape, dtype, strides, device).
:class:`Decoder` is the inverse, given a :class:`TensorSource` and a class resolver.

Everything that cannot be represented as data becomes ``{"$": "unrecorded", ...}`` and is listed
in ``Encoder.unrecorded``: reported, never silently dropped.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Callable
from typing import Any

import torch

from modulelens.capture.spec import (
    ModuleSpec,
    SpecVisitor,
    SpecWriter,
    TensorSpec,
    TensorStats,
    ValueKind,
)
from modulelens.errors import ReplayFailed

SHAPE_ONLY_DEFAULT_BYTES = 64 * 1024 * 1024


def class_path(obj_or_cls: Any) -> str:
    cls = obj_or_cls if isinstance(obj_or_cls, type) else type(obj_or_cls)
    return f"{cls.__module__}:{cls.__qualname__}"


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def parse_dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dt, torch.dtype):
        raise ReplayFailed(f"unknown dtype {name!r}", "use a torch dtype name such as float32 or bfloat16")
    return dt


def tensor_stats(t: torch.Tensor) -> TensorStats:
    """Summary statistics kept for shape-only tensors (enough to synthesise similar data)."""
    if t.numel() == 0:
        return TensorStats()
    x = t.detach()
    if x.is_complex():
        x = torch.view_as_real(x)
    if x.dtype == torch.bool:
        x = x.to(torch.float32)
    xf = x.to(torch.float64)
    finite = xf[torch.isfinite(xf)]
    stats = TensorStats(zero_fraction=float((xf == 0).double().mean()),
                        nonfinite_fraction=float(1.0 - finite.numel() / xf.numel()))
    if finite.numel():
        stats.mean, stats.std = float(finite.mean()), float(finite.std(unbiased=False))
        stats.min, stats.max = float(finite.min()), float(finite.max())
    return stats


class TensorSink:
    """Collects tensors to store. Tensors above ``max_bytes`` are kept shape-only with statistics."""

    def __init__(self, prefix: str = "", max_bytes: int = SHAPE_ONLY_DEFAULT_BYTES):
        self.prefix = prefix
        self.max_bytes = max_bytes
        self.tensors: dict[str, torch.Tensor] = {}
        self.shape_only: list[str] = []

    def add(self, key: str, t: torch.Tensor) -> dict[str, Any]:
        """Keep ``t`` (under ``prefix + key``) and return its spec."""
        key = self.prefix + key
        spec = TensorSpec(
            key=key, shape=list(t.shape), dtype=dtype_name(t.dtype), device=str(t.device),
            stride=list(t.stride()) if t.layout == torch.strided else None, contiguous=t.is_contiguous(),
            requires_grad=bool(t.requires_grad), parameter=isinstance(t, torch.nn.Parameter),
            layout=str(t.layout) if t.layout != torch.strided or t.is_quantized else None,
        )
        t = t.detach()
        if t.numel() * t.element_size() > self.max_bytes:
            spec.stored = False
            spec.stats = tensor_stats(t)
            self.shape_only.append(key)
        else:
            # safetensors needs dense, contiguous, unshared CPU storage.
            self.tensors[key] = t.to("cpu", copy=True).contiguous().clone()
        return spec.to_json()


class TensorSource:
    """Gives back stored tensors by key; synthesises shape-only ones from their statistics."""

    def __init__(
        self,
        tensors: dict[str, torch.Tensor],
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        seed: int = 0,
    ):
        self.tensors = tensors
        self.device = device
        self.dtype = dtype
        self.synthesized: list[str] = []
        self._gen = torch.Generator().manual_seed(seed)

    def get(self, spec: TensorSpec) -> torch.Tensor:
        dtype = parse_dtype(spec.dtype)
        if spec.stored:
            if spec.key not in self.tensors:
                raise ReplayFailed(f"stored tensor {spec.key!r} is missing from the artifact", "capture it again")
            t = self.tensors[spec.key]
        else:
            t = synthesize(spec.shape, dtype, spec.stats or TensorStats(), self._gen)
            self.synthesized.append(spec.key)
        device = self.device or spec.device
        target_dtype = self.dtype if (self.dtype is not None and dtype.is_floating_point) else dtype
        if spec.stride is not None and not spec.contiguous and list(t.shape) == spec.shape:
            out = torch.empty_strided(spec.shape, spec.stride, dtype=target_dtype, device=device)
            out.copy_(t)
        else:
            out = t.to(device=device, dtype=target_dtype, copy=True)
        if spec.requires_grad and out.is_floating_point():
            out.requires_grad_(True)
        return out


def synthesize(shape: list[int], dtype: torch.dtype, stats: TensorStats, gen: torch.Generator) -> torch.Tensor:
    """Random data of a matching distribution: normal(mean, std) clipped to [min, max], with the
    recorded fraction of zeros; integers uniform in [min, max]; booleans with P(True)=1-zeros.
    What was not measured counts as mean 0, std 1, range [0, 1], no zeros."""
    zero = stats.zero_fraction or 0.0
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) >= zero
    lo = stats.min if stats.min is not None else 0.0
    hi = stats.max if stats.max is not None else 1.0
    if not (dtype.is_floating_point or dtype.is_complex):
        return torch.randint(int(lo), int(hi) + 1, shape, generator=gen).to(dtype)
    std = stats.std if stats.std is not None else 1.0
    x = torch.randn(shape, generator=gen, dtype=torch.float64) * std + (stats.mean or 0.0)
    x = x.clamp(lo, hi)
    if zero > 0:
        x = x.masked_fill(torch.rand(shape, generator=gen, dtype=torch.float64) < zero, 0.0)
    return x.to(dtype)


# ---------------------------------------------------------------------------------------------
_WRITE = SpecWriter()


class Encoder:
    """Encodes values into specs, sending tensors to ``sink`` and noting what it cannot record.

    ``module_spec(module, path)`` is asked for nested ``nn.Module`` values (their recorded
    construction); it returns None when the module has no record.
    """

    def __init__(self, sink: TensorSink, module_spec: Callable[[torch.nn.Module, str], ModuleSpec | None] | None = None):
        self.sink = sink
        self.module_spec = module_spec
        self.unrecorded: list[str] = []

    def unrecorded_spec(self, value: Any, path: str, why: str) -> dict[str, Any]:
        self.unrecorded.append(f"{path}: {why}")
        try:
            text = repr(value)
        except Exception:  # noqa: BLE001 - repr of user objects may fail
            text = f"<{type(value).__name__}>"
        return _WRITE.unrecorded(class_path(value), text[:200], why)

    def encode(self, value: Any, path: str) -> Any:
        if value is None or isinstance(value, (bool, str)):
            return value
        if isinstance(value, int) and type(value) is int:
            return value
        if type(value) is float:
            return value if math.isfinite(value) else _WRITE.nonfinite_float(repr(value))
        if isinstance(value, torch.Tensor):
            return self.sink.add(path, value)
        if isinstance(value, torch.dtype):
            return _WRITE.dtype(dtype_name(value))
        if isinstance(value, torch.device):
            return _WRITE.device(str(value))
        if isinstance(value, (torch.memory_format, torch.layout, torch.qscheme)):
            return _WRITE.torch_constant(str(value).removeprefix("torch."))
        if isinstance(value, torch.Size):
            return _WRITE.size(list(value))
        if isinstance(value, enum.Enum):
            return _WRITE.enum(class_path(value), value.name)
        if isinstance(value, torch.nn.Module):
            spec = self.module_spec(value, path) if self.module_spec else None
            if spec is None:
                return self.unrecorded_spec(value, path, "module without a recorded construction")
            return _WRITE.module(spec)
        if isinstance(value, type):
            return _WRITE.type_ref(class_path(value))
        if isinstance(value, complex):
            return _WRITE.complex_number(value.real, value.imag)
        if isinstance(value, slice):
            return _WRITE.slice(*(self.encode(getattr(value, k), f"{path}.{k}") for k in ("start", "stop", "step")))
        if value is Ellipsis:
            return _WRITE.ellipsis()
        if isinstance(value, (int, float)):  # numpy scalars, IntEnum handled above, bool subclasses
            return _WRITE.number(class_path(value), value.item() if hasattr(value, "item") else float(value))
        if isinstance(value, tuple) and hasattr(value, "_fields"):
            fields = {f: self.encode(getattr(value, f), f"{path}.{f}") for f in value._fields}
            return _WRITE.record(ValueKind.NAMEDTUPLE, class_path(value), fields)
        if isinstance(value, (list, tuple)):
            kind = ValueKind.LIST if isinstance(value, list) else ValueKind.TUPLE
            items = [self.encode(v, f"{path}.{i}") for i, v in enumerate(value)]
            return _WRITE.sequence(kind, items, None if type(value) in (list, tuple) else class_path(value))
        if isinstance(value, dict):
            pairs = [(self.encode(k, f"{path}.<key>"), self.encode(v, f"{path}.{k}")) for k, v in value.items()]
            return _WRITE.mapping(pairs, None if type(value) is dict else class_path(value))
        if dataclasses.is_dataclass(value):
            fields = {f.name: self.encode(getattr(value, f.name), f"{path}.{f.name}") for f in dataclasses.fields(value)}
            return _WRITE.record(ValueKind.DATACLASS, class_path(value), fields)
        if callable(value) and hasattr(value, "__qualname__") and hasattr(value, "__module__"):
            qual = value.__qualname__
            if "<" in qual or value.__module__ is None:
                return self.unrecorded_spec(value, path, "a lambda or local function cannot be imported back")
            return _WRITE.callable_ref(f"{value.__module__}:{qual}")
        state = getattr(value, "__dict__", None)
        if isinstance(state, dict) and not isinstance(value, (torch.nn.Module,)):
            before = len(self.unrecorded)
            encoded = {k: self.encode(v, f"{path}.{k}") for k, v in state.items()}
            if len(self.unrecorded) == before:
                return _WRITE.object_state(class_path(value), encoded)
            del self.unrecorded[before:]
        return self.unrecorded_spec(value, path, f"values of type {class_path(value)} cannot be stored as data")


def flatten(value: Any) -> list[Any]:
    """Tensor and scalar leaves of a decoded value, in a stable order (used for comparisons)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [x for v in value.values() for x in flatten(v)]
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in flatten(v)]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [x for f in dataclasses.fields(value) for x in flatten(getattr(value, f.name))]
    return [value]


class Decoder(SpecVisitor[Any]):
    """Turns specs back into values. ``resolve(path)`` imports ``module:qualname`` objects;
    ``build_module(spec)`` rebuilds nested modules from their recorded construction."""

    def __init__(
        self,
        source: TensorSource,
        resolve: Callable[[str], Any],
        build_module: Callable[[ModuleSpec], torch.nn.Module] | None = None,
    ):
        self.source = source
        self.resolve = resolve
        self.build_module = build_module

    def decode(self, spec: Any) -> Any:
        return self.visit(spec)

    def scalar(self, value: Any) -> Any:
        return value

    def tensor(self, spec: TensorSpec) -> torch.Tensor:
        return self.source.get(spec)

    def nonfinite_float(self, text: str) -> float:
        return float(text)

    def dtype(self, name: str) -> torch.dtype:
        return parse_dtype(name)

    def device(self, name: str) -> torch.device:
        return torch.device(name)

    def torch_constant(self, name: str) -> Any:
        return getattr(torch, name)

    def size(self, dims: list[int]) -> torch.Size:
        return torch.Size(dims)

    def enum(self, cls: str, member: str) -> Any:
        return self.resolve(cls)[member]

    def type_ref(self, cls: str) -> Any:
        return self.resolve(cls)

    def callable_ref(self, path: str) -> Any:
        return self.resolve(path)

    def complex_number(self, real: float, imag: float) -> complex:
        return complex(real, imag)

    def slice(self, start: Any, stop: Any, step: Any) -> slice:
        return slice(self.visit(start), self.visit(stop), self.visit(step))

    def ellipsis(self) -> Any:
        return Ellipsis

    def number(self, cls: str, value: int | float) -> int | float:
        return value

    def sequence(self, kind: ValueKind, items: list[Any], cls: str | None) -> Any:
        values = [self.visit(v) for v in items]
        if cls is not None:
            return self.resolve(cls)(values)
        return values if kind == ValueKind.LIST else tuple(values)

    def mapping(self, items: list[tuple[Any, Any]], cls: str | None) -> Any:
        d = {self._key(k): self.visit(v) for k, v in items}
        return self.resolve(cls)(d) if cls is not None else d

    def record(self, kind: ValueKind, cls: str, fields: dict[str, Any]) -> Any:
        target = self.resolve(cls)
        values = {k: self.visit(v) for k, v in fields.items()}
        if kind == ValueKind.NAMEDTUPLE:
            return target(**values)
        init_names = {f.name for f in dataclasses.fields(target) if f.init}
        obj = target(**{k: v for k, v in values.items() if k in init_names})
        for k, v in values.items():
            if k not in init_names:
                object.__setattr__(obj, k, v)
        return obj

    def object_state(self, cls: str, state: dict[str, Any]) -> Any:
        target = self.resolve(cls)
        obj = target.__new__(target)
        obj.__dict__.update({k: self.visit(v) for k, v in state.items()})
        return obj

    def module(self, spec: ModuleSpec) -> torch.nn.Module:
        if self.build_module is None:
            raise ReplayFailed("nested module cannot be rebuilt here")
        return self.build_module(spec)

    def unrecorded(self, type_path: str, text: str, why: str) -> Any:
        raise ReplayFailed(
            f"a value of type {type_path} was not recorded ({why})",
            "use the export strategy, or make the value serialisable",
        )

    def unknown_kind(self, kind: str, spec: dict[str, Any]) -> Any:
        raise ReplayFailed(f"unknown value kind {kind!r} in the artifact", "upgrade modulelens")

    def _key(self, spec: Any) -> Any:
        v = self.visit(spec)
        return tuple(v) if isinstance(v, list) else v
