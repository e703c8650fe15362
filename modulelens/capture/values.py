"""Serialise Python values (module inputs, outputs, constructor arguments) as JSON plus tensors.

:class:`Encoder` turns a value into a JSON-able *spec* (the format is
:mod:`modulelens.capture.spec`'s); tensors go to a :class:`TensorSink` and the spec keeps a
:class:`~modulelens.capture.spec.TensorSpec` (key, shape, dtype, strides, device).
:class:`Decoder` is the inverse, given a :class:`TensorSource` and a class resolver.

Everything that cannot be represented as data becomes ``{"$": "unrecorded", ...}`` (its type, repr,
why, and where it was) and is listed in ``Encoder.found``: reported, never silently dropped. A
decoder given ``placeholders=True`` turns such a value into an :class:`UnrecordedValue`, which
fails with an error naming it as soon as the rebuilt code uses it (so a constructor argument that is
never used costs nothing).
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import enum
import json
import math
import pathlib
from collections.abc import Callable
from typing import Any, NoReturn

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


def _finite(x: torch.Tensor) -> torch.Tensor:
    """The finite elements of ``x`` (``x`` itself when all are: no masked copy)."""
    mask = torch.isfinite(x)
    return x if bool(mask.all()) else x[mask]


def tensor_stats(t: torch.Tensor, chunk: int = 1 << 16) -> TensorStats:
    """Summary statistics kept for shape-only tensors (enough to synthesise similar data),
    computed chunk by chunk on one float64 copy of the chunk, with in-place arithmetic and no
    widening temporaries: the memory it takes stays a few MiB whatever the tensor's size (the
    tensor is shape-only because it is too big to copy)."""
    if t.numel() == 0:
        return TensorStats()
    x = t.detach()
    if x.is_complex():
        x = torch.view_as_real(x)
    flat = x.reshape(-1)
    n = flat.numel()
    zeros = finite = 0
    total = total_sq = 0.0
    lo, hi = math.inf, -math.inf
    for start in range(0, n, chunk):
        part = flat[start: start + chunk].to(torch.float64, copy=True)
        zeros += part.numel() - int(torch.count_nonzero(part))  # NaN counts as non-zero, as ``== 0`` says
        ok = _finite(part)
        if ok.numel():
            finite += ok.numel()
            total += float(ok.sum())
            low, high = torch.aminmax(ok)
            lo, hi = min(lo, float(low)), max(hi, float(high))
    stats = TensorStats(zero_fraction=zeros / n, nonfinite_fraction=1.0 - finite / n)
    if finite:
        mean = total / finite
        for start in range(0, n, chunk):  # second pass: the spread around the mean, stably
            ok = _finite(flat[start: start + chunk].to(torch.float64, copy=True)).sub_(mean)
            total_sq += float(torch.dot(ok, ok))
        stats.mean, stats.std, stats.min, stats.max = mean, math.sqrt(total_sq / finite), lo, hi
    return stats


def tensor_spec(key: str, t: torch.Tensor) -> TensorSpec:
    """The spec of tensor ``t`` stored under ``key``."""
    return TensorSpec(
        key=key, shape=list(t.shape), dtype=dtype_name(t.dtype), device=str(t.device),
        stride=list(t.stride()) if t.layout == torch.strided else None, contiguous=t.is_contiguous(),
        requires_grad=bool(t.requires_grad), parameter=isinstance(t, torch.nn.Parameter), leaf=bool(t.is_leaf),
        layout=str(t.layout) if t.layout != torch.strided or t.is_quantized else None,
    )


def may_overlap_itself(t: torch.Tensor) -> bool:
    """Whether two elements of strided tensor ``t`` may share memory (a broadcast, stride-0 view;
    an ``as_strided`` window view): True unless its strides, smallest first, each step past all
    the elements of the dimensions below."""
    reach = 0
    for size, stride in sorted((d for d in zip(t.shape, t.stride()) if d[0] > 1), key=lambda d: d[1]):
        if stride <= reach:
            return True
        reach += (size - 1) * stride
    return False


def _extent(t: torch.Tensor) -> tuple[int, int]:
    """The storage elements ``[start, end)`` strided tensor ``t`` reaches."""
    start = t.storage_offset()
    return start, start + 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))


@dataclasses.dataclass
class _Held:
    """A tensor of a sink that shares memory: its spec, extent and element type."""

    key: str
    spec: dict[str, Any]
    start: int
    end: int
    dtype: torch.dtype
    group: int


class StorageRelations:
    """Finds which tensors of one value share memory, as the encoder meets them, and writes each
    group's :class:`~modulelens.capture.spec.StorageView` into their specs. Tensors whose element
    ranges in one storage overlap form a group (views of one buffer that never meet, such as the
    rows of a batch cut in chunks, stay apart: no write to one can reach another); a tensor whose
    elements share memory among themselves is a group alone. ``lost`` says, one ``key: why`` line
    each, where a relation is not kept (the tensors are then rebuilt as separate copies)."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.held: dict[tuple[str, int], list[_Held]] = {}
        self.lost: list[str] = []
        self._groups = 0

    def add(self, key: str, t: torch.Tensor, spec: dict[str, Any]) -> None:
        if t.layout != torch.strided or t.is_quantized or t.numel() == 0 or t.device.type == "meta":
            return
        try:
            where = (str(t.device), t.untyped_storage().data_ptr())
        except (RuntimeError, NotImplementedError):  # tensor subclasses and functional tensors have none
            return
        start, end = _extent(t)
        entries = self.held.setdefault(where, [])
        met = {e.group for e in entries if e.start < end and start < e.end}
        if not met and not may_overlap_itself(t):
            entries.append(_Held(key, spec, start, end, t.dtype, -1))
            return
        self._groups += 1
        group = self._groups
        for e in entries:
            if e.group in met or (e.group == -1 and e.start < end and start < e.end):
                e.group = group
        entries.append(_Held(key, spec, start, end, t.dtype, group))
        self._write(group, [e for e in entries if e.group == group])

    def _write(self, group: int, members: list[_Held]) -> None:
        dtypes = {e.dtype for e in members}
        if len(dtypes) > 1:
            names = ", ".join(f"{e.key} ({dtype_name(e.dtype)})" for e in members)
            self.lost = [ln for ln in self.lost if not any(ln.startswith(f"{e.key}:") for e in members)]
            self.lost.append(f"{members[-1].key}: shares memory with tensors of other element types ({names}); "
                             "rebuilt as separate copies, so in-place writes to one do not reach the others")
            for e in members:
                e.spec.pop("storage", None)
            return
        low, high = min(e.start for e in members), max(e.end for e in members)
        for e in members:
            e.spec["storage"] = {"id": f"{self.prefix}{group}", "offset": e.start - low, "span": high - low}


class TensorSink:
    """Collects tensors to store. Tensors above ``max_bytes`` (None: no limit) are kept shape-only
    with statistics. :attr:`relations` records which of them share memory (aliases, broadcast
    views), so that a replay rebuilds them as they were."""

    def __init__(self, prefix: str = "", max_bytes: int | None = None):
        self.prefix = prefix
        self.max_bytes = max_bytes
        self.tensors: dict[str, torch.Tensor] = {}
        self.specs: dict[str, dict[str, Any]] = {}
        self.shape_only: list[str] = []
        self.relations = StorageRelations(f"{prefix}storage.")

    def add(self, key: str, t: torch.Tensor, part_of: torch.Tensor | None = None) -> dict[str, Any]:
        """Keep ``t`` (under ``prefix + key``) and return its spec. ``part_of``: the tensor ``t`` was
        cut from, whose autograd role (requires grad, leaf) the spec keeps."""
        key = self.prefix + key
        spec = tensor_spec(key, t)
        if part_of is not None:
            spec.requires_grad, spec.leaf = bool(part_of.requires_grad), bool(part_of.is_leaf)
        t = t.detach()
        if self.max_bytes is not None and t.numel() * t.element_size() > self.max_bytes:
            spec.stored = False
            spec.stats = tensor_stats(t)
            self.shape_only.append(key)
        else:
            # safetensors needs dense, contiguous, unshared CPU storage: one copy gives it.
            self.tensors[key] = t.to("cpu", copy=True, memory_format=torch.contiguous_format)
        self.specs[key] = spec.to_json()
        if part_of is None:  # a cut (a batch slice) is a new tensor: its relations are not the run's
            self.relations.add(key, t, self.specs[key])
        return self.specs[key]


class ReferenceSink(TensorSink):
    """Keeps the tensors themselves (no copies): for reading a value's tensors by their keys."""

    def add(self, key: str, t: torch.Tensor) -> dict[str, Any]:
        key = self.prefix + key
        self.tensors[key] = t
        return tensor_spec(key, t).to_json()


def keyed_tensors(value: Any, path: str) -> tuple[Any, dict[str, torch.Tensor]]:
    """The spec of ``value`` encoded at ``path`` and its tensors by key (the tensors themselves).
    Keys are those a capture gives the same value (``output.0``, ``args.1.layers.0.keys``)."""
    sink = ReferenceSink()
    spec = Encoder(sink).encode(value, path)
    return spec, sink.tensors


def sharing_groups(specs: dict[str, TensorSpec]) -> list[frozenset[str]]:
    """Which tensors of one value shared memory, as their specs record it: one set of keys per
    storage id (a broadcast view alone in its memory is a set of one)."""
    groups: dict[str, set[str]] = {}
    for key, spec in specs.items():
        if spec.storage is not None:
            groups.setdefault(spec.storage.id, set()).add(key)
    return sorted((frozenset(g) for g in groups.values()), key=sorted)


def layout_differences(captured: dict[str, TensorSpec], replayed: dict[str, torch.Tensor]) -> list[str]:
    """How the tensors of a replayed value differ in memory layout from the captured ones, one line
    each: strides (a copy where the run returned a view, or the reverse), and which tensors share
    memory (aliases and broadcast views, as :class:`StorageRelations` finds them). Tensors missing on
    either side are left to the value comparison."""
    keys = [k for k in captured if k in replayed]
    lines = [f"{k} has strides {list(replayed[k].stride())} in the replay, {captured[k].stride} in the run"
             for k in keys if captured[k].stride is not None and replayed[k].layout == torch.strided
             and replayed[k].numel() > 1 and list(replayed[k].stride()) != captured[k].stride]
    relations = StorageRelations("replayed.")
    specs = {k: tensor_spec(k, replayed[k]).to_json() for k in keys}
    for k in keys:
        relations.add(k, replayed[k], specs[k])  # writes a group's view into every member's spec
    found = {k: TensorSpec.from_json(spec) for k, spec in specs.items()}
    was, now = sharing_groups({k: captured[k] for k in keys}), sharing_groups(found)
    if was != now:
        def text(groups: list[frozenset[str]]) -> str:
            return "; ".join(" = ".join(sorted(g)) if len(g) > 1 else f"{next(iter(g))} (broadcast view)"
                             for g in groups) or "none"
        lines.append(f"shared memory differs: in the run {text(was)}, in the replay {text(now)}")
    return lines


def keyed_values(value: Any, path: str, out: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every leaf of a value (tensors and other values) by the key the encoder gives it: containers,
    dataclasses and objects holding state are walked into; anything else is a leaf."""
    out = {} if out is None else out
    if isinstance(value, torch.Tensor) or value is None or isinstance(value, (bool, int, float, str, enum.Enum)):
        out[path] = value
    elif isinstance(value, tuple) and hasattr(value, "_fields"):
        for f in value._fields:
            keyed_values(getattr(value, f), f"{path}.{f}", out)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            keyed_values(v, f"{path}.{i}", out)
    elif isinstance(value, dict):
        for k, v in value.items():
            keyed_values(v, f"{path}.{k}", out)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            keyed_values(getattr(value, f.name), f"{path}.{f.name}", out)
    elif isinstance(getattr(value, "__dict__", None), dict) and not isinstance(value, (type, torch.nn.Module)):
        for k, v in vars(value).items():
            keyed_values(v, f"{path}.{k}", out)
    else:
        out[path] = value
    return out


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
        self.leaves: dict[int, torch.Tensor] = {}  # id of a non-leaf given out -> the leaf it was cloned from
        self.storages: dict[str, torch.Tensor] = {}  # storage id -> the buffer its views share
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
        if spec.storage is not None and spec.stride is not None and list(t.shape) == spec.shape:
            return self._shared_view(spec, t, target_dtype, device)
        if spec.stride is not None and not spec.contiguous and list(t.shape) == spec.shape:
            out = torch.empty_strided(spec.shape, spec.stride, dtype=target_dtype, device=device)
            out.copy_(t)
        else:
            out = t.to(device=device, dtype=target_dtype, copy=True)
        if spec.requires_grad and out.is_floating_point():
            out.requires_grad_(True)
            if not spec.leaf:  # an activation in the run: in-place operations on it were allowed
                leaf, out = out, out.clone()
                self.leaves[id(out)] = leaf
        return out

    def _shared_view(self, spec: TensorSpec, values: torch.Tensor, dtype: torch.dtype,
                     device: str | torch.device) -> torch.Tensor:
        """``spec``'s tensor as the strided view of its group's buffer (one per storage id, made
        at the first member met), its stored values written through it (where members meet, their
        values are the same memory's: equal). A group that requires grad is a clone of a leaf, as
        an activation is, so its views may be changed in place; each view keeps its gradient."""
        slot = spec.storage
        assert slot is not None
        held = self.storages.get(slot.id)
        if held is None:
            buffer = torch.zeros(slot.span, dtype=dtype, device=device)
            work = buffer
            if spec.requires_grad and buffer.is_floating_point():
                work = buffer.requires_grad_(True).clone()
            held = self.storages[slot.id] = work
        with torch.no_grad():
            where = torch.arange(slot.span, device=held.device).as_strided(spec.shape, spec.stride, slot.offset)
            held.detach().view(-1).index_put_((where.reshape(-1),), values.to(held.device, dtype).reshape(-1))
        grad = spec.requires_grad and held.requires_grad
        out = (held if grad else held.detach()).as_strided(spec.shape, spec.stride, slot.offset)
        if grad:
            out.retain_grad()
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
    # drawn in float32 (float64 for float64), in place: a multi-GiB weight needs one buffer, not several
    work = torch.float64 if dtype in (torch.float64, torch.complex128) else torch.float32
    x = torch.randn(shape, generator=gen, dtype=work).mul_(std).add_(stats.mean or 0.0).clamp_(lo, hi)
    if zero > 0:
        x.masked_fill_(torch.rand(shape, generator=gen) < zero, 0.0)
    return x.to(dtype)


# ---------------------------------------------------------------------------------------------
_WRITE = SpecWriter()


@dataclasses.dataclass
class Unrecorded:
    """A value the encoder could not write as data: where it was (``path``), its type (``module:
    QualName``), a short ``repr``, and ``why``. ``owner`` and ``attribute`` name the object attribute
    that holds it (the innermost one) when it sits in an object's state, such as a config field:
    reads of that attribute can be watched."""

    path: str
    type: str
    repr: str
    why: str
    owner: Any = None
    attribute: str = ""
    value: Any = None

    def text(self) -> str:
        return f"{self.path}: {self.why}"


def _short_repr(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - repr of user objects may fail
        text = f"<{type(value).__name__}>"
    return text[:200]


def _canonical(spec: Any) -> str:
    return json.dumps(spec, sort_keys=True, default=str)


class Encoder:
    """Encodes values into specs, sending tensors to ``sink`` and noting what it cannot record.

    ``module_spec(module, path)`` is asked for nested ``nn.Module`` values (their recorded
    construction); it returns None when the module has no record.
    """

    def __init__(self, sink: TensorSink, module_spec: Callable[[torch.nn.Module, str], ModuleSpec | None] | None = None):
        self.sink = sink
        self.module_spec = module_spec
        self.found: list[Unrecorded] = []

    @property
    def unrecorded(self) -> list[str]:
        """What could not be recorded, one ``path: why`` line each."""
        return [u.text() for u in self.found]

    def unrecorded_spec(self, value: Any, path: str, why: str) -> dict[str, Any]:
        entry = Unrecorded(path=path, type=class_path(value), repr=_short_repr(value), why=why, value=value)
        self.found.append(entry)
        return _WRITE.unrecorded(entry.type, entry.repr, why, path)

    def _attribute(self, owner: Any, name: str, value: Any, path: str) -> Any:
        """Encode attribute ``name`` of ``owner``; values inside it that cannot be recorded are
        noted as held by that attribute (unless a deeper object holds them)."""
        before = len(self.found)
        spec = self.encode(value, path)
        for entry in self.found[before:]:
            if entry.owner is None:
                entry.owner, entry.attribute = owner, name
        return spec

    def _dataclass_state(self, value: Any, path: str) -> dict[str, Any]:
        """The declared fields of a dataclass instance, then every other attribute it holds
        (``__dict__`` entries set by ``__post_init__`` or after construction, private ones too), as
        they are now. Attributes kept in slots outside the declared fields are not seen."""
        names = [f.name for f in dataclasses.fields(value)]
        names += [k for k in getattr(value, "__dict__", {}) if k not in names]
        state = getattr(value, "__dict__", {})
        return {name: self._attribute(value, name, state[name] if name in state else getattr(value, name),
                                      f"{path}.{name}")
                for name in names if name in state or hasattr(value, name)}

    def _set(self, value: set | frozenset, path: str) -> dict[str, Any]:
        """Items in a canonical order (their specs sorted), so that a capture does not depend on
        the process's hash seed."""
        items = sorted((self.encode(v, f"{path}.{i}") for i, v in enumerate(value)), key=_canonical)
        exact = type(value) in (set, frozenset)
        return _WRITE.set_value(items, isinstance(value, frozenset), None if exact else class_path(value))

    def encode(self, value: Any, path: str) -> Any:
        if isinstance(value, enum.Enum):  # before str and int: StrEnum and IntEnum members keep their class
            return _WRITE.enum(class_path(value), value.name or "")  # "A|B": flags combined; "": no flag
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
            if isinstance(value, collections.defaultdict):
                cls = None if type(value) is collections.defaultdict else class_path(value)
                return _WRITE.default_mapping(pairs, self.encode(value.default_factory, f"{path}.<default>"), cls)
            return _WRITE.mapping(pairs, None if type(value) is dict else class_path(value))
        if isinstance(value, (set, frozenset)):
            return self._set(value, path)
        if isinstance(value, range):
            return _WRITE.range_value(value.start, value.stop, value.step)
        if isinstance(value, pathlib.PurePath):
            return _WRITE.path(class_path(value), str(value))
        if isinstance(value, (datetime.date, datetime.time)):  # datetime is a date
            return _WRITE.datetime_value(class_path(value), value.isoformat())
        if isinstance(value, datetime.timedelta):
            return _WRITE.timedelta_value(value.days, value.seconds, value.microseconds)
        if dataclasses.is_dataclass(value):
            return _WRITE.record(ValueKind.DATACLASS, class_path(value), self._dataclass_state(value, path))
        if callable(value) and hasattr(value, "__qualname__") and hasattr(value, "__module__"):
            qual = value.__qualname__
            if "<" in qual or value.__module__ is None:
                return self.unrecorded_spec(value, path, "a lambda or local function cannot be imported back")
            return _WRITE.callable_ref(f"{value.__module__}:{qual}")
        state = getattr(value, "__dict__", None)
        if isinstance(state, dict) and not isinstance(value, (torch.nn.Module,)):
            # attribute by attribute: one that cannot be stored is noted alone, the rest is kept
            encoded = {k: self._attribute(value, k, v, f"{path}.{k}") for k, v in list(state.items())}
            return _WRITE.object_state(class_path(value), encoded)
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


def tensors_in(value: Any) -> list[torch.Tensor]:
    """The tensors among the leaves of ``value`` (:func:`flatten`), in the same order."""
    return [x for x in flatten(value) if isinstance(x, torch.Tensor)]


def restore_dataclass(cls: type, state: dict[str, Any]) -> Any:
    """A dataclass instance with exactly ``state``: built from its init fields, then every recorded
    attribute set as recorded (what ``__post_init__`` derived, extras and private attributes).
    A field held by an :class:`UnrecordedValue` is left to its default while the instance is built
    (validation would reject the placeholder), then set like the others."""
    fields = [f for f in dataclasses.fields(cls) if f.init]
    has_default = {f.name for f in fields
                   if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING}
    init_names = {f.name for f in fields if not (isinstance(state.get(f.name), UnrecordedValue) and f.name in has_default)}
    obj = cls(**{k: v for k, v in state.items() if k in init_names})
    for k, v in state.items():
        object.__setattr__(obj, k, v)
    return obj


class UnrecordedValue:
    """Stands for a value that was not recorded (:class:`Decoder` with ``placeholders``): holding or
    passing it on is harmless; using it (calling it, reading an attribute, testing, iterating,
    comparing, hashing, doing arithmetic) raises :class:`ReplayFailed` naming where it was."""

    __slots__ = ("_at", "_type", "_why")

    def __init__(self, at: str, type_path: str, why: str):
        object.__setattr__(self, "_at", at)
        object.__setattr__(self, "_type", type_path)
        object.__setattr__(self, "_why", why)

    def _used(self, *_: Any, **__: Any) -> NoReturn:
        at = object.__getattribute__(self, "_at") or "a value"
        raise ReplayFailed(
            f"the rebuilt module uses {at} (a {object.__getattribute__(self, '_type')}), which was not recorded "
            f"at capture ({object.__getattribute__(self, '_why')})",
            "use [--strategy export], or make the value serialisable and capture again",
        )

    def __getattr__(self, name: str) -> Any:
        self._used()

    def __repr__(self) -> str:
        return f"<unrecorded {object.__getattribute__(self, '_at') or 'value'}>"

    def __copy__(self) -> UnrecordedValue:
        return self

    def __deepcopy__(self, memo: dict) -> UnrecordedValue:
        return self


for _name in ("__call__", "__bool__", "__len__", "__iter__", "__contains__", "__getitem__", "__setitem__",
              "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__hash__", "__int__", "__float__",
              "__index__", "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__",
              "__rtruediv__", "__floordiv__", "__mod__", "__pow__", "__neg__", "__and__", "__or__", "__rand__",
              "__ror__", "__xor__", "__setattr__", "__enter__", "__exit__", "__format__", "__str__"):
    setattr(UnrecordedValue, _name, UnrecordedValue._used)


class Decoder(SpecVisitor[Any]):
    """Turns specs back into values. ``resolve(path)`` imports ``module:qualname`` objects;
    ``build_module(spec)`` rebuilds nested modules from their recorded construction. A value that
    was not recorded raises :class:`ReplayFailed` naming it, or with ``placeholders`` becomes an
    :class:`UnrecordedValue` that does so only when used."""

    def __init__(
        self,
        source: TensorSource,
        resolve: Callable[[str], Any],
        build_module: Callable[[ModuleSpec], torch.nn.Module] | None = None,
        placeholders: bool = False,
    ):
        self.source = source
        self.resolve = resolve
        self.build_module = build_module
        self.placeholders = placeholders

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
        target = self.resolve(cls)
        if member in target.__members__:
            return target[member]
        if issubclass(target, enum.Flag):  # flags combined ("A|B"), or none ("")
            value = target(0)
            for part in filter(None, member.split("|")):
                value |= target[part]
            return value
        return target[member]  # the KeyError names what is missing

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

    def default_mapping(self, items: list[tuple[Any, Any]], factory: Any, cls: str | None) -> Any:
        target = self.resolve(cls) if cls is not None else collections.defaultdict
        return target(self.visit(factory), {self._key(k): self.visit(v) for k, v in items})

    def set_value(self, items: list[Any], frozen: bool, cls: str | None) -> Any:
        values = [self._key(v) for v in items]
        return (self.resolve(cls) if cls is not None else frozenset if frozen else set)(values)

    def range_value(self, start: int, stop: int, step: int) -> range:
        return range(start, stop, step)

    def path(self, cls: str, text: str) -> Any:
        return self.resolve(cls)(text)

    def datetime_value(self, cls: str, iso: str) -> Any:
        return self.resolve(cls).fromisoformat(iso)

    def timedelta_value(self, days: int, seconds: int, microseconds: int) -> datetime.timedelta:
        return datetime.timedelta(days=days, seconds=seconds, microseconds=microseconds)

    def record(self, kind: ValueKind, cls: str, fields: dict[str, Any]) -> Any:
        target = self.resolve(cls)
        values = {k: self.visit(v) for k, v in fields.items()}
        if kind == ValueKind.NAMEDTUPLE:
            return target(**values)
        return restore_dataclass(target, values)

    def object_state(self, cls: str, state: dict[str, Any]) -> Any:
        target = self.resolve(cls)
        obj = target.__new__(target)
        obj.__dict__.update({k: self.visit(v) for k, v in state.items()})
        return obj

    def module(self, spec: ModuleSpec) -> torch.nn.Module:
        if self.build_module is None:
            raise ReplayFailed("nested module cannot be rebuilt here")
        return self.build_module(spec)

    def unrecorded(self, type_path: str, text: str, why: str, at: str = "") -> Any:
        if self.placeholders:
            return UnrecordedValue(at, type_path, why)
        raise ReplayFailed(
            f"{at or 'a value'} (a {type_path}: {text[:80]}) was not recorded at capture ({why})",
            "use the export strategy, or make the value serialisable and capture again",
        )

    def unknown_kind(self, kind: str, spec: dict[str, Any]) -> Any:
        raise ReplayFailed(f"unknown value kind {kind!r} in the artifact", "upgrade modulelens")

    def _key(self, spec: Any) -> Any:
        v = self.visit(spec)
        return tuple(v) if isinstance(v, list) else v
