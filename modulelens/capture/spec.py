"""The value-spec format: how a Python value (a module's inputs, outputs, constructor arguments, an
operator's arguments) is written as JSON.

A *spec* is either a JSON scalar (``None``, ``bool``, ``int``, a finite ``float``, ``str``) standing
for itself, or a JSON object whose ``"$"`` field names its :class:`ValueKind` and whose other fields
depend on the kind. Tensors are written as :class:`TensorSpec` (shape, dtype, strides, device, and
the key of their data in a tensor file); nested modules as :class:`ModuleSpec` (class and
constructor arguments).

This module is the one place that knows the fields of each kind:

* :class:`SpecVisitor` reads specs. ``visit(spec)`` calls the visitor's method for the spec's kind
  with that kind's fields (``enum(cls, member)``, ``sequence(kind, items, cls)``, ...); child specs
  are passed as they are stored, and a method visits them when it needs their values. This is the
  one traversal: the decoder (:class:`modulelens.capture.values.Decoder`), the repro renderer,
  the walkers of :mod:`modulelens.capture.spec_walk`, the kernel templates' call decoder and the
  prompt describer are visitors.
* :class:`SpecWriter` writes specs: the same methods, returning the spec of those fields (the
  encoder uses it), so ``SpecWriter().visit(spec) == spec`` for every kind.
* :class:`~modulelens.capture.spec_walk.SpecWalker` (in :mod:`modulelens.capture.spec_walk`, with
  :func:`~modulelens.capture.spec_walk.tensor_leaves` and
  :func:`~modulelens.capture.spec_walk.referenced_modules`) visits every node of a spec, for
  visitors that collect something.

Specs written by earlier versions have the same form; a kind this version does not know is an
:class:`UnknownValueKind` error (a newer modulelens wrote it).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_serializer

from modulelens.errors import ModuleLensError
from modulelens.repo import validation_problem

KIND = "$"
"""The field of a spec object that names its kind."""

R = TypeVar("R")
Scalar = None | bool | int | float | str


class ValueKind(StrEnum):
    """The kinds of spec objects (the value of their ``"$"`` field)."""

    TENSOR = "tensor"
    FLOAT = "float"  # a float that JSON cannot hold: inf, -inf, nan
    DTYPE = "dtype"
    DEVICE = "device"
    TORCH = "torch"  # another torch constant: memory format, layout, qscheme
    SIZE = "size"
    ENUM = "enum"
    TYPE = "type"
    CALLABLE = "callable"
    COMPLEX = "complex"
    SLICE = "slice"
    ELLIPSIS = "ellipsis"
    NUMBER = "number"  # a scalar of another library (numpy), or a subclass of int or float
    LIST = "list"
    TUPLE = "tuple"
    DICT = "dict"
    DEFAULTDICT = "defaultdict"  # a dict with its default factory
    SET = "set"  # a set or frozenset (items in a canonical order)
    RANGE = "range"
    PATH = "path"  # a pathlib path
    DATETIME = "datetime"  # a datetime, date or time, as ISO 8601 text
    TIMEDELTA = "timedelta"
    NAMEDTUPLE = "namedtuple"
    DATACLASS = "dataclass"
    OBJECT = "object"  # an object written as its class and its ``__dict__``
    MODULE = "module"  # an nn.Module written as its recorded construction
    UNRECORDED = "unrecorded"  # a value that could not be written as data (kept for the report)


class InvalidSpec(ModuleLensError):
    """A value spec that does not have the form of its kind (damaged or hand-edited)."""


class UnknownValueKind(InvalidSpec):
    """A spec kind this version does not know (written by a newer modulelens)."""


class UnsupportedValueKind(InvalidSpec):
    """A spec kind that the visitor reading it does not handle."""


class _SpecModel(BaseModel):
    """A spec object read into a model. Unknown fields are kept (written back unchanged)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    @classmethod
    def from_json(cls, data: Any) -> Any:
        """The model of a stored spec object; :class:`InvalidSpec` when it does not fit."""
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            raise InvalidSpec(
                f"a stored {cls.__name__} does not have the expected form ({validation_problem(e, 'spec')})",
                "the artifact was edited or damaged outside modulelens; capture it again",
            ) from None

    def to_json(self) -> dict[str, Any]:
        """The spec object as stored."""
        return self.model_dump(mode="json")


class TensorStats(_SpecModel):
    """The summary kept for a tensor stored shape-only: enough to make up similar data. A field is
    absent when it cannot be measured (mean, std, min and max of a tensor without finite values)."""

    mean: float | None = None
    std: float | None = None
    min: float | None = None
    max: float | None = None
    zero_fraction: float | None = None
    nonfinite_fraction: float | None = None

    @model_serializer
    def _stored_form(self) -> dict[str, Any]:
        measured = {name: getattr(self, name) for name in type(self).model_fields}
        return {**{k: v for k, v in measured.items() if v is not None}, **(self.model_extra or {})}


class StorageView(_SpecModel):
    """Where a tensor sits in memory it shares: with other tensors of the same value (inputs that
    alias each other, overlapping views of one buffer) or with itself (a broadcast, stride-0 view,
    whose elements share memory). ``id`` names the shared memory within the value (one per call's
    inputs, another per its outputs); ``offset`` is the tensor's first element in it, counted from
    the lowest element any tensor of the group uses; ``span`` is how many elements the group covers.
    A replay rebuilds one buffer of ``span`` elements per ``id`` and each tensor as the strided
    view of it at ``offset``: in-place writes reach every alias as they did in the run."""

    id: str
    offset: int
    span: int


class TensorSpec(_SpecModel):
    """A tensor: its metadata, and the key of its data in the artifact's tensor file.

    ``stored`` is False for a tensor kept shape-only (too big): ``stats`` then holds its summary,
    so that similar data can be made up.
    ``stride`` is None for non-strided layouts, whose name is in ``layout``.
    ``leaf`` is False for a tensor that requires grad and was computed in the run (an activation,
    not a leaf of autograd): replay gives it back as such (a clone of a leaf), so that in-place
    operations on it are allowed as they were."""

    kind: Literal[ValueKind.TENSOR] = Field(ValueKind.TENSOR, alias=KIND)
    key: str
    shape: list[int]
    dtype: str = Field(description="torch dtype name without the 'torch.' prefix: float32, bfloat16, ...")
    device: str = "cpu"
    stride: list[int] | None = None
    contiguous: bool = True
    requires_grad: bool = False
    parameter: bool = False
    leaf: bool = True
    layout: str | None = None
    stored: bool = True
    stats: TensorStats | None = None
    storage: StorageView | None = Field(None, description="memory shared with other tensors or within itself")

    @model_serializer
    def _stored_form(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            KIND: ValueKind.TENSOR.value, "key": self.key, "shape": list(self.shape), "dtype": self.dtype,
            "device": self.device, "stride": None if self.stride is None else list(self.stride),
            "contiguous": self.contiguous, "requires_grad": self.requires_grad,
        }
        if self.parameter:
            out["parameter"] = True
        if not self.leaf:
            out["leaf"] = False
        if self.layout is not None:
            out["layout"] = self.layout
        out["stored"] = self.stored
        if self.stats is not None:
            out["stats"] = self.stats.to_json()
        if self.storage is not None:
            out["storage"] = self.storage.model_dump()
        out.update(self.model_extra or {})
        return out


class ModuleSpec(_SpecModel):
    """An ``nn.Module`` as its recorded construction: ``cls(*args, **kwargs)``, the arguments as
    specs. ``bind_error`` says why the arguments did not bind to the constructor's signature."""

    kind: Literal[ValueKind.MODULE] = Field(ValueKind.MODULE, alias=KIND)
    cls: str = Field(description="module:QualName of the class")
    args: list[Any] = Field(default_factory=list)
    kwargs: dict[str, Any] = Field(default_factory=dict)
    bind_error: str | None = None

    @model_serializer
    def _stored_form(self) -> dict[str, Any]:
        out: dict[str, Any] = {KIND: ValueKind.MODULE.value, "cls": self.cls, "args": list(self.args),
                               "kwargs": dict(self.kwargs)}
        if self.bind_error:
            out["bind_error"] = self.bind_error
        out.update(self.model_extra or {})
        return out


# -- reading ----------------------------------------------------------------------------------

def _text(spec: dict[str, Any], field: str) -> str:
    value = spec[field]
    if not isinstance(value, str):
        raise TypeError(f"{field} must be a string")
    return value


def _list(spec: dict[str, Any], field: str) -> list[Any]:
    value = spec[field]
    if not isinstance(value, list):
        raise TypeError(f"{field} must be a list")
    return value


def _object(spec: dict[str, Any], field: str) -> dict[str, Any]:
    value = spec[field]
    if not isinstance(value, dict):
        raise TypeError(f"{field} must be an object")
    return value


def _optional_text(spec: dict[str, Any], field: str) -> str | None:
    return _text(spec, field) if spec.get(field) is not None else None


def _pairs(spec: dict[str, Any]) -> list[tuple[Any, Any]]:
    pairs = _list(spec, "items")
    if not all(isinstance(p, list) and len(p) == 2 for p in pairs):
        raise TypeError("items must be [key, value] pairs")
    return [(k, v) for k, v in pairs]


def _int(spec: dict[str, Any], field: str) -> int:
    value = spec[field]
    if type(value) is not int:
        raise TypeError(f"{field} must be an integer")
    return value


def _range_items(spec: dict[str, Any]) -> tuple[int, int, int]:
    items = _list(spec, "items")
    if len(items) != 3 or not all(type(i) is int for i in items):
        raise TypeError("items must be three integers [start, stop, step]")
    return items[0], items[1], items[2]


def _slice_items(spec: dict[str, Any]) -> tuple[Any, Any, Any]:
    items = _list(spec, "items")
    if len(items) != 3:
        raise TypeError("items must be [start, stop, step]")
    return items[0], items[1], items[2]


# kind -> (visitor method, the method's arguments read from the spec object)
_READERS: dict[ValueKind, tuple[str, Any]] = {
    ValueKind.TENSOR: ("tensor", lambda s: (TensorSpec.from_json(s),)),
    ValueKind.FLOAT: ("nonfinite_float", lambda s: (_text(s, "v"),)),
    ValueKind.DTYPE: ("dtype", lambda s: (_text(s, "name"),)),
    ValueKind.DEVICE: ("device", lambda s: (_text(s, "v"),)),
    ValueKind.TORCH: ("torch_constant", lambda s: (_text(s, "name"),)),
    ValueKind.SIZE: ("size", lambda s: (list(_list(s, "items")),)),
    ValueKind.ENUM: ("enum", lambda s: (_text(s, "cls"), _text(s, "name"))),
    ValueKind.TYPE: ("type_ref", lambda s: (_text(s, "cls"),)),
    ValueKind.CALLABLE: ("callable_ref", lambda s: (_text(s, "path"),)),
    ValueKind.COMPLEX: ("complex_number", lambda s: (float(s["re"]), float(s["im"]))),
    ValueKind.SLICE: ("slice", _slice_items),
    ValueKind.ELLIPSIS: ("ellipsis", lambda s: ()),
    ValueKind.NUMBER: ("number", lambda s: (_text(s, "cls"), s["v"])),
    ValueKind.LIST: ("sequence", lambda s: (ValueKind.LIST, _list(s, "items"), _optional_text(s, "cls"))),
    ValueKind.TUPLE: ("sequence", lambda s: (ValueKind.TUPLE, _list(s, "items"), _optional_text(s, "cls"))),
    ValueKind.DICT: ("mapping", lambda s: (_pairs(s), _optional_text(s, "cls"))),
    ValueKind.DEFAULTDICT: ("default_mapping", lambda s: (_pairs(s), s["factory"], _optional_text(s, "cls"))),
    ValueKind.SET: ("set_value", lambda s: (_list(s, "items"), bool(s.get("frozen", False)), _optional_text(s, "cls"))),
    ValueKind.RANGE: ("range_value", _range_items),
    ValueKind.PATH: ("path", lambda s: (_text(s, "cls"), _text(s, "v"))),
    ValueKind.DATETIME: ("datetime_value", lambda s: (_text(s, "cls"), _text(s, "v"))),
    ValueKind.TIMEDELTA: ("timedelta_value", lambda s: (_int(s, "days"), _int(s, "seconds"), _int(s, "us"))),
    ValueKind.NAMEDTUPLE: ("record", lambda s: (ValueKind.NAMEDTUPLE, _text(s, "cls"), _object(s, "fields"))),
    ValueKind.DATACLASS: ("record", lambda s: (ValueKind.DATACLASS, _text(s, "cls"), _object(s, "fields"))),
    ValueKind.OBJECT: ("object_state", lambda s: (_text(s, "cls"), _object(s, "state"))),
    ValueKind.MODULE: ("module", lambda s: (ModuleSpec.from_json(s),)),
    ValueKind.UNRECORDED: ("unrecorded", lambda s: (_text(s, "type"), _text(s, "repr"), _text(s, "why"),
                                                    _optional_text(s, "at") or "")),
}


class SpecVisitor(Generic[R]):
    """Reads a spec: :meth:`visit` calls the method of the spec's kind with its fields.

    Subclasses override the methods of the kinds they handle; a kind whose method is not
    overridden goes to :meth:`unsupported`. Child specs (items, fields, arguments) arrive as stored:
    call :meth:`visit` on those whose value is needed. Override :meth:`unknown_kind` and
    :meth:`malformed` to report those cases in the caller's own terms."""

    def visit(self, spec: Any) -> R:
        if spec is None or isinstance(spec, (bool, int, float, str)):
            return self.scalar(spec)
        if not isinstance(spec, dict) or KIND not in spec:
            return self.malformed(spec, "a value spec is a JSON scalar or an object with a '$' field")
        try:
            kind = ValueKind(spec[KIND])
        except ValueError:
            return self.unknown_kind(str(spec[KIND]), spec)
        method, read = _READERS[kind]
        if getattr(type(self), method) is getattr(SpecVisitor, method):
            return self.unsupported(kind, spec)
        try:
            fields = read(spec)
        except (KeyError, TypeError, ValueError) as e:
            return self.malformed(spec, f"a {kind.value} spec: {e}")
        return getattr(self, method)(*fields)

    # -- one method per kind (not overridden: unsupported) --------------------------------------
    def scalar(self, value: Scalar) -> R:
        """None, bool, int, finite float or str: the value itself."""
        raise UnsupportedValueKind(f"plain values ({type(value).__name__}) are not supported here")

    def tensor(self, spec: TensorSpec) -> R:
        raise NotImplementedError

    def nonfinite_float(self, text: str) -> R:
        """``repr`` of the float: ``inf``, ``-inf`` or ``nan``."""
        raise NotImplementedError

    def dtype(self, name: str) -> R:
        """A torch dtype by name without the ``torch.`` prefix."""
        raise NotImplementedError

    def device(self, name: str) -> R:
        raise NotImplementedError

    def torch_constant(self, name: str) -> R:
        """An attribute of ``torch``: a memory format, layout or qscheme."""
        raise NotImplementedError

    def size(self, dims: list[int]) -> R:
        """A ``torch.Size`` (its dimensions are plain ints, not specs)."""
        raise NotImplementedError

    def enum(self, cls: str, member: str) -> R:
        raise NotImplementedError

    def type_ref(self, cls: str) -> R:
        raise NotImplementedError

    def callable_ref(self, path: str) -> R:
        """An importable function, ``module:qualname``."""
        raise NotImplementedError

    def complex_number(self, real: float, imag: float) -> R:
        raise NotImplementedError

    def slice(self, start: Any, stop: Any, step: Any) -> R:
        """A slice; its three parts are specs."""
        raise NotImplementedError

    def ellipsis(self) -> R:
        raise NotImplementedError

    def number(self, cls: str, value: int | float) -> R:
        """A scalar of another type than int or float (numpy), and its Python value."""
        raise NotImplementedError

    def sequence(self, kind: ValueKind, items: list[Any], cls: str | None) -> R:
        """A list or tuple (``kind``); ``cls`` for a subclass, built from the list of items."""
        raise NotImplementedError

    def mapping(self, items: list[tuple[Any, Any]], cls: str | None) -> R:
        """A dict as (key spec, value spec) pairs in order; ``cls`` for a subclass."""
        raise NotImplementedError

    def default_mapping(self, items: list[tuple[Any, Any]], factory: Any, cls: str | None) -> R:
        """A ``collections.defaultdict`` (``cls`` for a subclass): its pairs as in :meth:`mapping`,
        and the spec of its default factory (None when it has none)."""
        raise NotImplementedError

    def set_value(self, items: list[Any], frozen: bool, cls: str | None) -> R:
        """A set, or a frozenset when ``frozen``; ``cls`` for a subclass. Items are specs, stored
        in a canonical order (a set has none of its own)."""
        raise NotImplementedError

    def range_value(self, start: int, stop: int, step: int) -> R:
        raise NotImplementedError

    def path(self, cls: str, text: str) -> R:
        """A ``pathlib`` path of class ``cls`` (``pathlib:PosixPath``...) and its text."""
        raise NotImplementedError

    def datetime_value(self, cls: str, iso: str) -> R:
        """A ``datetime``, ``date`` or ``time`` (``cls``), as its ISO 8601 text (a time zone as its
        UTC offset)."""
        raise NotImplementedError

    def timedelta_value(self, days: int, seconds: int, microseconds: int) -> R:
        raise NotImplementedError

    def record(self, kind: ValueKind, cls: str, fields: dict[str, Any]) -> R:
        """A namedtuple or dataclass (``kind``) with its fields as specs."""
        raise NotImplementedError

    def object_state(self, cls: str, state: dict[str, Any]) -> R:
        """An object written as its class and its ``__dict__`` (values as specs)."""
        raise NotImplementedError

    def module(self, spec: ModuleSpec) -> R:
        raise NotImplementedError

    def unrecorded(self, type_path: str, text: str, why: str, at: str = "") -> R:
        """A value that could not be written as data: its type, a short repr, why, and where it
        was in the recorded value (``init.config.field``; empty in specs of earlier versions)."""
        raise NotImplementedError

    # -- the other cases ---------------------------------------------------------------------
    def unsupported(self, kind: ValueKind, spec: dict[str, Any]) -> R:
        """A kind whose method this visitor does not override."""
        raise UnsupportedValueKind(f"values of kind {kind.value!r} are not supported here")

    def unknown_kind(self, kind: str, spec: dict[str, Any]) -> R:
        raise UnknownValueKind(f"unknown value kind {kind!r} in the artifact", "upgrade modulelens")

    def malformed(self, spec: Any, why: str) -> R:
        raise InvalidSpec(
            f"a stored value spec does not have the expected form ({why})",
            "the artifact was edited or damaged outside modulelens; capture it again",
        )


class SpecWriter(SpecVisitor[Any]):
    """Writes specs: each method returns the spec of its fields (children must already be specs).

    ``SpecWriter().visit(spec)`` gives back an equal spec, for every kind."""

    def scalar(self, value: Scalar) -> Any:
        return value

    def tensor(self, spec: TensorSpec) -> dict[str, Any]:
        return spec.to_json()

    def nonfinite_float(self, text: str) -> dict[str, Any]:
        return {KIND: ValueKind.FLOAT.value, "v": text}

    def dtype(self, name: str) -> dict[str, Any]:
        return {KIND: ValueKind.DTYPE.value, "name": name}

    def device(self, name: str) -> dict[str, Any]:
        return {KIND: ValueKind.DEVICE.value, "v": name}

    def torch_constant(self, name: str) -> dict[str, Any]:
        return {KIND: ValueKind.TORCH.value, "name": name}

    def size(self, dims: list[int]) -> dict[str, Any]:
        return {KIND: ValueKind.SIZE.value, "items": list(dims)}

    def enum(self, cls: str, member: str) -> dict[str, Any]:
        return {KIND: ValueKind.ENUM.value, "cls": cls, "name": member}

    def type_ref(self, cls: str) -> dict[str, Any]:
        return {KIND: ValueKind.TYPE.value, "cls": cls}

    def callable_ref(self, path: str) -> dict[str, Any]:
        return {KIND: ValueKind.CALLABLE.value, "path": path}

    def complex_number(self, real: float, imag: float) -> dict[str, Any]:
        return {KIND: ValueKind.COMPLEX.value, "re": real, "im": imag}

    def slice(self, start: Any, stop: Any, step: Any) -> dict[str, Any]:
        return {KIND: ValueKind.SLICE.value, "items": [start, stop, step]}

    def ellipsis(self) -> dict[str, Any]:
        return {KIND: ValueKind.ELLIPSIS.value}

    def number(self, cls: str, value: int | float) -> dict[str, Any]:
        return {KIND: ValueKind.NUMBER.value, "cls": cls, "v": value}

    def sequence(self, kind: ValueKind, items: list[Any], cls: str | None) -> dict[str, Any]:
        if kind not in (ValueKind.LIST, ValueKind.TUPLE):
            raise ValueError(f"a sequence is a list or a tuple, not {kind.value}")
        spec = {KIND: kind.value, "items": list(items)}
        if cls is not None:
            spec["cls"] = cls
        return spec

    def mapping(self, items: list[tuple[Any, Any]], cls: str | None) -> dict[str, Any]:
        spec = {KIND: ValueKind.DICT.value, "items": [[k, v] for k, v in items]}
        if cls is not None:
            spec["cls"] = cls
        return spec

    def default_mapping(self, items: list[tuple[Any, Any]], factory: Any, cls: str | None) -> dict[str, Any]:
        spec = {KIND: ValueKind.DEFAULTDICT.value, "items": [[k, v] for k, v in items], "factory": factory}
        if cls is not None:
            spec["cls"] = cls
        return spec

    def set_value(self, items: list[Any], frozen: bool, cls: str | None) -> dict[str, Any]:
        spec: dict[str, Any] = {KIND: ValueKind.SET.value, "items": list(items)}
        if frozen:
            spec["frozen"] = True
        if cls is not None:
            spec["cls"] = cls
        return spec

    def range_value(self, start: int, stop: int, step: int) -> dict[str, Any]:
        return {KIND: ValueKind.RANGE.value, "items": [start, stop, step]}

    def path(self, cls: str, text: str) -> dict[str, Any]:
        return {KIND: ValueKind.PATH.value, "cls": cls, "v": text}

    def datetime_value(self, cls: str, iso: str) -> dict[str, Any]:
        return {KIND: ValueKind.DATETIME.value, "cls": cls, "v": iso}

    def timedelta_value(self, days: int, seconds: int, microseconds: int) -> dict[str, Any]:
        return {KIND: ValueKind.TIMEDELTA.value, "days": days, "seconds": seconds, "us": microseconds}

    def record(self, kind: ValueKind, cls: str, fields: dict[str, Any]) -> dict[str, Any]:
        if kind not in (ValueKind.NAMEDTUPLE, ValueKind.DATACLASS):
            raise ValueError(f"a record is a namedtuple or a dataclass, not {kind.value}")
        return {KIND: kind.value, "cls": cls, "fields": dict(fields)}

    def object_state(self, cls: str, state: dict[str, Any]) -> dict[str, Any]:
        return {KIND: ValueKind.OBJECT.value, "cls": cls, "state": dict(state)}

    def module(self, spec: ModuleSpec) -> dict[str, Any]:
        return spec.to_json()

    def unrecorded(self, type_path: str, text: str, why: str, at: str = "") -> dict[str, Any]:
        spec = {KIND: ValueKind.UNRECORDED.value, "type": type_path, "repr": text, "why": why}
        if at:
            spec["at"] = at
        return spec



class _SequenceItems(SpecVisitor[list[Any]]):
    def scalar(self, value: Scalar) -> list[Any]:
        if value is not None:
            return super().scalar(value)
        return []

    def sequence(self, kind: ValueKind, items: list[Any], cls: str | None) -> list[Any]:
        return list(items)


class _MappingItems(SpecVisitor[list[tuple[Any, Any]]]):
    def scalar(self, value: Scalar) -> list[tuple[Any, Any]]:
        if value is not None:
            return super().scalar(value)
        return []

    def mapping(self, items: list[tuple[Any, Any]], cls: str | None) -> list[tuple[Any, Any]]:
        return list(items)


def sequence_items(spec: Any) -> list[Any]:
    """The item specs of a list or tuple spec (a stored call's positional arguments); None has
    none. Another kind is an :class:`UnsupportedValueKind` error."""
    return _SequenceItems().visit(spec)


def mapping_items(spec: Any) -> list[tuple[Any, Any]]:
    """The (key spec, value spec) pairs of a dict spec, in order (a stored call's keyword
    arguments); None has none. Another kind is an :class:`UnsupportedValueKind` error."""
    return _MappingItems().visit(spec)
