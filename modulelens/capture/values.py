"""Serialise Python values (module inputs, outputs, constructor arguments) as JSON plus tensors.

``encode`` turns a value into a JSON-able *spec*; tensors go to a :class:`TensorSink` and the spec
keeps a reference (``{"$": "tensor", "key": ...}``) with shape, dtype, strides and device.
``decode`` is the inverse, given a :class:`TensorSource` and a class resolver.

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

from modulelens.errors import ReplayFailed

SHAPE_ONLY_DEFAULT_BYTES = 64 * 1024 * 1024

_BUILTIN_CONTAINERS = (list, tuple, dict)


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


def tensor_stats(t: torch.Tensor) -> dict[str, float]:
    """Summary statistics kept for shape-only tensors (enough to synthesise similar data)."""
    if t.numel() == 0:
        return {}
    x = t.detach()
    if x.is_complex():
        x = torch.view_as_real(x)
    if x.dtype == torch.bool:
        x = x.to(torch.float32)
    xf = x.to(torch.float64) if x.is_floating_point() else x.to(torch.float64)
    finite = xf[torch.isfinite(xf)]
    out = {"zero_fraction": float((xf == 0).double().mean())}
    if finite.numel():
        out.update(
            mean=float(finite.mean()),
            std=float(finite.std(unbiased=False)),
            min=float(finite.min()),
            max=float(finite.max()),
        )
    out["nonfinite_fraction"] = float(1.0 - finite.numel() / xf.numel())
    return out


class TensorSink:
    """Collects tensors to store. Tensors above ``max_bytes`` are kept shape-only with statistics."""

    def __init__(self, prefix: str = "", max_bytes: int = SHAPE_ONLY_DEFAULT_BYTES):
        self.prefix = prefix
        self.max_bytes = max_bytes
        self.tensors: dict[str, torch.Tensor] = {}
        self.shape_only: list[str] = []

    def add(self, key: str, t: torch.Tensor) -> dict[str, Any]:
        key = self.prefix + key
        requires_grad = bool(t.requires_grad)
        is_param = isinstance(t, torch.nn.Parameter)
        t = t.detach()
        spec: dict[str, Any] = {
            "$": "tensor",
            "key": key,
            "shape": list(t.shape),
            "dtype": dtype_name(t.dtype),
            "device": str(t.device),
            "stride": list(t.stride()) if t.layout == torch.strided else None,
            "contiguous": t.is_contiguous(),
            "requires_grad": requires_grad,
        }
        if is_param:
            spec["parameter"] = True
        if t.layout != torch.strided or t.is_quantized:
            spec["layout"] = str(t.layout)
        nbytes = t.numel() * t.element_size()
        if nbytes > self.max_bytes:
            spec["stored"] = False
            spec["stats"] = tensor_stats(t)
            self.shape_only.append(key)
        else:
            spec["stored"] = True
            # safetensors needs dense, contiguous, unshared CPU storage.
            self.tensors[key] = t.to("cpu", copy=True).contiguous().clone()
        return spec


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

    def get(self, spec: dict[str, Any]) -> torch.Tensor:
        dtype = parse_dtype(spec["dtype"])
        if spec.get("stored", True):
            if spec["key"] not in self.tensors:
                raise ReplayFailed(f"stored tensor {spec['key']!r} is missing from the artifact", "capture it again")
            t = self.tensors[spec["key"]]
        else:
            t = synthesize(spec["shape"], dtype, spec.get("stats", {}), self._gen)
            self.synthesized.append(spec["key"])
        device = self.device or spec.get("device", "cpu")
        target_dtype = self.dtype if (self.dtype is not None and dtype.is_floating_point) else dtype
        stride = spec.get("stride")
        if stride is not None and not spec.get("contiguous", True) and list(t.shape) == spec["shape"]:
            out = torch.empty_strided(spec["shape"], stride, dtype=target_dtype, device=device)
            out.copy_(t)
        else:
            out = t.to(device=device, dtype=target_dtype, copy=True)
        if spec.get("requires_grad") and out.is_floating_point():
            out.requires_grad_(True)
        return out


def synthesize(shape: list[int], dtype: torch.dtype, stats: dict[str, float], gen: torch.Generator) -> torch.Tensor:
    """Random data of a matching distribution: normal(mean, std) clipped to [min, max], with the
    recorded fraction of zeros; integers uniform in [min, max]; booleans with P(True)=1-zeros."""
    zero = stats.get("zero_fraction", 0.0)
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) >= zero
    lo, hi = stats.get("min", 0.0), stats.get("max", 1.0)
    if not (dtype.is_floating_point or dtype.is_complex):
        return torch.randint(int(lo), int(hi) + 1, shape, generator=gen).to(dtype)
    x = torch.randn(shape, generator=gen, dtype=torch.float64) * stats.get("std", 1.0) + stats.get("mean", 0.0)
    x = x.clamp(lo, hi)
    if zero > 0:
        x = x.masked_fill(torch.rand(shape, generator=gen, dtype=torch.float64) < zero, 0.0)
    return x.to(dtype)


# ---------------------------------------------------------------------------------------------
class Encoder:
    """Encodes values into specs, sending tensors to ``sink`` and noting what it cannot record.

    ``module_spec(module)`` is asked for nested ``nn.Module`` values (their recorded construction);
    it returns None when the module has no record.
    """

    def __init__(self, sink: TensorSink, module_spec: Callable[[torch.nn.Module, str], Any] | None = None):
        self.sink = sink
        self.module_spec = module_spec
        self.unrecorded: list[str] = []

    def unrecorded_spec(self, value: Any, path: str, why: str) -> dict[str, Any]:
        self.unrecorded.append(f"{path}: {why}")
        try:
            text = repr(value)
        except Exception:  # noqa: BLE001 - repr of user objects may fail
            text = f"<{type(value).__name__}>"
        return {"$": "unrecorded", "type": class_path(value), "repr": text[:200], "why": why}

    def encode(self, value: Any, path: str) -> Any:
        if value is None or isinstance(value, (bool, str)):
            return value
        if isinstance(value, int) and type(value) is int:
            return value
        if type(value) is float:
            return value if math.isfinite(value) else {"$": "float", "v": repr(value)}
        if isinstance(value, torch.Tensor):
            return self.sink.add(path, value)
        if isinstance(value, torch.dtype):
            return {"$": "dtype", "name": dtype_name(value)}
        if isinstance(value, torch.device):
            return {"$": "device", "v": str(value)}
        if isinstance(value, (torch.memory_format, torch.layout, torch.qscheme)):
            return {"$": "torch", "name": str(value).removeprefix("torch.")}
        if isinstance(value, torch.Size):
            return {"$": "size", "items": list(value)}
        if isinstance(value, enum.Enum):
            return {"$": "enum", "cls": class_path(value), "name": value.name}
        if isinstance(value, torch.nn.Module):
            spec = self.module_spec(value, path) if self.module_spec else None
            if spec is None:
                return self.unrecorded_spec(value, path, "module without a recorded construction")
            return spec
        if isinstance(value, type):
            return {"$": "type", "cls": class_path(value)}
        if isinstance(value, complex):
            return {"$": "complex", "re": value.real, "im": value.imag}
        if isinstance(value, slice):
            return {"$": "slice", "items": [self.encode(getattr(value, k), f"{path}.{k}") for k in ("start", "stop", "step")]}
        if value is Ellipsis:
            return {"$": "ellipsis"}
        if isinstance(value, (int, float)):  # numpy scalars, IntEnum handled above, bool subclasses
            return {"$": "number", "cls": class_path(value), "v": value.item() if hasattr(value, "item") else float(value)}
        if isinstance(value, tuple) and hasattr(value, "_fields"):
            return {
                "$": "namedtuple",
                "cls": class_path(value),
                "fields": {f: self.encode(getattr(value, f), f"{path}.{f}") for f in value._fields},
            }
        if isinstance(value, (list, tuple)):
            kind = "list" if isinstance(value, list) else "tuple"
            spec = {"$": kind, "items": [self.encode(v, f"{path}.{i}") for i, v in enumerate(value)]}
            if type(value) not in (list, tuple):
                spec["cls"] = class_path(value)
            return spec
        if isinstance(value, dict):
            spec = {"$": "dict", "items": [[self.encode(k, f"{path}.<key>"), self.encode(v, f"{path}.{k}")] for k, v in value.items()]}
            if type(value) is not dict:
                spec["cls"] = class_path(value)
            return spec
        if dataclasses.is_dataclass(value):
            return {
                "$": "dataclass",
                "cls": class_path(value),
                "fields": {f.name: self.encode(getattr(value, f.name), f"{path}.{f.name}") for f in dataclasses.fields(value)},
            }
        if callable(value) and hasattr(value, "__qualname__") and hasattr(value, "__module__"):
            qual = value.__qualname__
            if "<" in qual or value.__module__ is None:
                return self.unrecorded_spec(value, path, "a lambda or local function cannot be imported back")
            return {"$": "callable", "path": f"{value.__module__}:{qual}"}
        state = getattr(value, "__dict__", None)
        if isinstance(state, dict) and not isinstance(value, (torch.nn.Module,)):
            before = len(self.unrecorded)
            encoded = {k: self.encode(v, f"{path}.{k}") for k, v in state.items()}
            if len(self.unrecorded) == before:
                return {"$": "object", "cls": class_path(value), "state": encoded}
            del self.unrecorded[before:]
        return self.unrecorded_spec(value, path, f"values of type {class_path(value)} cannot be stored as data")


def leaves(spec: Any) -> list[dict[str, Any]]:
    """All tensor leaf specs inside a spec, in order."""
    out: list[dict[str, Any]] = []

    def walk(s: Any) -> None:
        if isinstance(s, dict):
            if s.get("$") == "tensor":
                out.append(s)
                return
            for v in s.values():
                walk(v)
        elif isinstance(s, list):
            for v in s:
                walk(v)

    walk(spec)
    return out


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


class Decoder:
    """Turns specs back into values. ``resolve(path)`` imports ``module:qualname`` objects;
    ``build_module(spec)`` rebuilds nested modules from their recorded construction."""

    def __init__(
        self,
        source: TensorSource,
        resolve: Callable[[str], Any],
        build_module: Callable[[dict[str, Any]], torch.nn.Module] | None = None,
    ):
        self.source = source
        self.resolve = resolve
        self.build_module = build_module

    def decode(self, spec: Any) -> Any:
        if not isinstance(spec, dict):
            return spec
        kind = spec.get("$")
        if kind == "tensor":
            return self.source.get(spec)
        if kind == "float":
            return float(spec["v"])
        if kind == "dtype":
            return parse_dtype(spec["name"])
        if kind == "device":
            return torch.device(spec["v"])
        if kind == "torch":
            return getattr(torch, spec["name"])
        if kind == "size":
            return torch.Size(spec["items"])
        if kind == "enum":
            return self.resolve(spec["cls"])[spec["name"]]
        if kind == "type":
            return self.resolve(spec["cls"])
        if kind == "callable":
            return self.resolve(spec["path"])
        if kind == "complex":
            return complex(spec["re"], spec["im"])
        if kind == "slice":
            return slice(*[self.decode(v) for v in spec["items"]])
        if kind == "ellipsis":
            return Ellipsis
        if kind == "number":
            return spec["v"]
        if kind in ("list", "tuple"):
            items = [self.decode(v) for v in spec["items"]]
            if "cls" in spec:
                return self.resolve(spec["cls"])(items)
            return items if kind == "list" else tuple(items)
        if kind == "dict":
            d = {self._key(k): self.decode(v) for k, v in spec["items"]}
            return self.resolve(spec["cls"])(d) if "cls" in spec else d
        if kind == "namedtuple":
            return self.resolve(spec["cls"])(**{k: self.decode(v) for k, v in spec["fields"].items()})
        if kind == "dataclass":
            cls = self.resolve(spec["cls"])
            values = {k: self.decode(v) for k, v in spec["fields"].items()}
            init_names = {f.name for f in dataclasses.fields(cls) if f.init}
            obj = cls(**{k: v for k, v in values.items() if k in init_names})
            for k, v in values.items():
                if k not in init_names:
                    object.__setattr__(obj, k, v)
            return obj
        if kind == "object":
            cls = self.resolve(spec["cls"])
            obj = cls.__new__(cls)
            obj.__dict__.update({k: self.decode(v) for k, v in spec["state"].items()})
            return obj
        if kind == "module":
            if self.build_module is None:
                raise ReplayFailed("nested module cannot be rebuilt here")
            return self.build_module(spec)
        if kind == "unrecorded":
            raise ReplayFailed(
                f"a value of type {spec['type']} was not recorded ({spec['why']})",
                "use the export strategy, or make the value serialisable",
            )
        raise ReplayFailed(f"unknown value kind {kind!r} in the artifact", "upgrade modulelens")

    def _key(self, spec: Any) -> Any:
        v = self.decode(spec)
        return tuple(v) if isinstance(v, list) else v
