"""Argument values of a stored sample call in words and types, for the prompts: a value spec
(the format of :mod:`modulelens.capture.spec`) as a C++ type, a Python type and a description,
read through the spec's one traversal (:class:`~modulelens.capture.spec.SpecVisitor`)."""

from __future__ import annotations

import json
from typing import Any

from modulelens.capture import SpecVisitor, TensorSpec, ValueKind


def tensor_text(shape: Any, dtype: Any, stride: Any, contiguous: bool) -> str:
    """A tensor in words: shape, dtype, strides and whether it is contiguous."""
    contig = "contiguous" if contiguous else "non-contiguous"
    return f"shape {shape}, {dtype}, strides {stride} ({contig})"


def spec_tensor_text(spec: TensorSpec) -> str:
    """:func:`tensor_text` of a stored tensor."""
    return tensor_text(spec.shape, spec.dtype, spec.stride, spec.contiguous)


class _Kind(SpecVisitor[str]):
    """The kind of a spec in one word: ``tensor``, the Python type of a plain value, or the kind's
    name (``dict`` and ``list`` for a JSON object or list that is no spec)."""

    def scalar(self, value: Any) -> str:
        return type(value).__name__

    def tensor(self, spec: TensorSpec) -> str:
        return "tensor"

    def unsupported(self, kind: ValueKind, spec: dict[str, Any]) -> str:
        return kind.value

    def unknown_kind(self, kind: str, spec: dict[str, Any]) -> str:
        return kind

    def malformed(self, spec: Any, why: str) -> str:
        return type(spec).__name__


def value_kind(spec: Any) -> str:
    """The kind of a spec in one word (see :class:`_Kind`)."""
    return _Kind().visit(spec)


_CPP_SCALAR = {"bool": "bool", "int": "int64_t", "float": "double", "str": "std::string"}
_PY_SCALAR = {"bool": "bool", "int": "int", "float": "float", "str": "str"}


def _schema_optional(schema_type: str | None) -> tuple[str, str]:
    """C++ and Python types for a None value, from the schema's ``Optional[...]`` type."""
    inner = (schema_type or "").removeprefix("Optional[").removesuffix("]")
    table = {
        "Tensor": ("c10::optional<torch::Tensor>", "torch.Tensor | None"),
        "int": ("c10::optional<int64_t>", "int | None"),
        "float": ("c10::optional<double>", "float | None"),
        "bool": ("c10::optional<bool>", "bool | None"),
        "List[int]": ("c10::optional<std::vector<int64_t>>", "list[int] | None"),
        "number": ("c10::optional<double>", "float | None"),
    }
    return table.get(inner, ("c10::optional<torch::Tensor>", "None"))


Described = tuple[str, str, str]


class _ValueDescriber(SpecVisitor[Described]):
    """(C++ type, Python type, description) of one stored value ``spec`` whose aten schema type is
    ``schema_type``. Lists are described from their items' kinds; a kind without a closer
    description is a ``py::object`` with the stored spec as text."""

    def __init__(self, spec: Any, schema_type: str | None):
        self.spec = spec
        self.schema_type = schema_type

    def describe(self) -> Described:
        return self.visit(self.spec)

    def tensor(self, spec: TensorSpec) -> Described:
        return "torch::Tensor", "torch.Tensor", "Tensor, " + spec_tensor_text(spec)

    def scalar(self, value: Any) -> Described:
        if value is None:
            cpp, py = _schema_optional(self.schema_type)
            return cpp, py, "None"
        name = type(value).__name__
        return _CPP_SCALAR[name], _PY_SCALAR[name], f"{name} = {value!r}"

    def nonfinite_float(self, text: str) -> Described:
        return "double", "float", f"float = {text}"

    def sequence(self, kind: ValueKind, items: list[Any], cls: str | None) -> Described:
        return self._list(items, kind.value)

    def size(self, dims: list[int]) -> Described:
        return self._list(dims, ValueKind.SIZE.value)

    def _list(self, items: list[Any], kind: str) -> Described:
        kinds = {value_kind(i) for i in items}
        if kinds <= {"int"}:
            return "std::vector<int64_t>", "list[int]", f"list of int = {items}"
        if kinds <= {"int", "float"}:
            return "std::vector<double>", "list[float]", f"list of float = {items}"
        if kinds <= {"bool"}:
            return "std::vector<bool>", "list[bool]", f"list of bool = {items}"
        if kinds <= {"tensor", "NoneType"}:
            texts = ["None" if i is None else spec_tensor_text(TensorSpec.from_json(i)) for i in items]
            if "NoneType" not in kinds:
                return ("std::vector<torch::Tensor>", "list[torch.Tensor]",
                        f"list of {len(items)} tensors: {'; '.join(texts)}")
            return ("std::vector<c10::optional<torch::Tensor>>", "list[torch.Tensor | None]",
                    f"list of {len(items)} optional tensors: {'; '.join(texts)}")
        return self._other(kind)

    def dtype(self, name: str) -> Described:
        return "at::ScalarType", "torch.dtype", f"torch.dtype = {name}"

    def device(self, name: str) -> Described:
        return "at::Device", "torch.device", f"torch.device = {name!r}"

    def torch_constant(self, name: str) -> Described:
        return "at::MemoryFormat", "torch object", f"torch.{name}"

    def number(self, cls: str, value: int | float) -> Described:
        if isinstance(value, int):
            return "int64_t", "int", f"int = {value!r}"
        return "double", "float", f"float = {value!r}"

    def unsupported(self, kind: ValueKind, spec: dict[str, Any]) -> Described:
        return self._other(kind.value)

    def unknown_kind(self, kind: str, spec: dict[str, Any]) -> Described:
        return self._other(kind)

    def malformed(self, spec: Any, why: str) -> Described:
        return self._other(type(spec).__name__)

    def _other(self, kind: str) -> Described:
        return "py::object", "object", f"{kind} value {json.dumps(self.spec, default=str)[:200]}"


def describe_value(spec: Any, schema_type: str | None) -> Described:
    """(C++ type, Python type, description) of one stored argument value."""
    return _ValueDescriber(spec, schema_type).describe()
