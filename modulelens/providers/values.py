"""Argument values of a stored sample call in words and types, for the prompts: a value spec
(the format of :mod:`modulelens.capture.values`) as a C++ type, a Python type and a description."""

from __future__ import annotations

import json
from typing import Any


def value_kind(spec: Any) -> str:
    if isinstance(spec, dict):
        return spec.get("$", "dict")
    return type(spec).__name__


def spec_items(spec: Any) -> list[Any]:
    return list(spec.get("items", [])) if isinstance(spec, dict) else []


def tensor_text(t: dict[str, Any]) -> str:
    contig = "contiguous" if t.get("contiguous") else "non-contiguous"
    return f"shape {t.get('shape')}, {t.get('dtype')}, strides {t.get('stride')} ({contig})"


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


def describe_value(spec: Any, schema_type: str | None) -> tuple[str, str, str]:
    """(C++ type, Python type, description) of one stored argument value."""
    kind = value_kind(spec)
    if kind == "tensor":
        return "torch::Tensor", "torch.Tensor", "Tensor, " + tensor_text(spec)
    if spec is None:
        cpp, py = _schema_optional(schema_type)
        return cpp, py, "None"
    if isinstance(spec, (bool, int, float, str)):
        name = type(spec).__name__
        return _CPP_SCALAR[name], _PY_SCALAR[name], f"{name} = {spec!r}"
    if kind == "float":  # inf / nan
        return "double", "float", f"float = {spec.get('v')}"
    if kind in ("list", "tuple", "size"):
        items = spec_items(spec)
        kinds = {value_kind(i) for i in items}
        if kinds <= {"int"}:
            return "std::vector<int64_t>", "list[int]", f"list of int = {items}"
        if kinds <= {"int", "float"}:
            return "std::vector<double>", "list[float]", f"list of float = {items}"
        if kinds <= {"bool"}:
            return "std::vector<bool>", "list[bool]", f"list of bool = {items}"
        if kinds <= {"tensor"}:
            shapes = "; ".join(tensor_text(i) for i in items)
            return "std::vector<torch::Tensor>", "list[torch.Tensor]", f"list of {len(items)} tensors: {shapes}"
        if kinds <= {"tensor", "NoneType"}:
            shapes = "; ".join("None" if i is None else tensor_text(i) for i in items)
            return ("std::vector<c10::optional<torch::Tensor>>", "list[torch.Tensor | None]",
                    f"list of {len(items)} optional tensors: {shapes}")
    if kind == "dtype":
        return "at::ScalarType", "torch.dtype", f"torch.dtype = {spec.get('name')}"
    if kind == "device":
        return "at::Device", "torch.device", f"torch.device = {spec.get('v')!r}"
    if kind == "torch":
        return "at::MemoryFormat", "torch object", f"torch.{spec.get('name')}"
    if kind == "number":
        v = spec.get("v")
        return ("int64_t", "int", f"int = {v!r}") if isinstance(v, int) else ("double", "float", f"float = {v!r}")
    return "py::object", "object", f"{kind} value {json.dumps(spec, default=str)[:200]}"
