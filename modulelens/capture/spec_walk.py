"""Walking every node of a value spec (:mod:`modulelens.capture.spec`) to collect what it holds:
:class:`SpecWalker`, and with it :func:`tensor_leaves` and :func:`referenced_modules`."""

from __future__ import annotations

from typing import Any

from modulelens.capture.spec import ModuleSpec, Scalar, SpecVisitor, TensorSpec, ValueKind

__all__ = ["SpecWalker", "referenced_modules", "tensor_leaves"]


class SpecWalker(SpecVisitor[None]):
    """Visits every node of a spec depth-first, in stored order (dict keys before their values,
    constructor arguments before keyword arguments). Override :meth:`tensor` or
    :meth:`class_ref` to collect what a spec holds; the other methods only walk."""

    def class_ref(self, path: str) -> None:
        """Called for every ``module:qualname`` the spec refers to (classes and functions)."""

    def scalar(self, value: Scalar) -> None:
        pass

    def tensor(self, spec: TensorSpec) -> None:
        pass

    def nonfinite_float(self, text: str) -> None:
        pass

    def dtype(self, name: str) -> None:
        pass

    def device(self, name: str) -> None:
        pass

    def torch_constant(self, name: str) -> None:
        pass

    def size(self, dims: list[int]) -> None:
        pass

    def enum(self, cls: str, member: str) -> None:
        self.class_ref(cls)

    def type_ref(self, cls: str) -> None:
        self.class_ref(cls)

    def callable_ref(self, path: str) -> None:
        self.class_ref(path)

    def complex_number(self, real: float, imag: float) -> None:
        pass

    def slice(self, start: Any, stop: Any, step: Any) -> None:
        for part in (start, stop, step):
            self.visit(part)

    def ellipsis(self) -> None:
        pass

    def number(self, cls: str, value: int | float) -> None:
        self.class_ref(cls)

    def sequence(self, kind: ValueKind, items: list[Any], cls: str | None) -> None:
        if cls is not None:
            self.class_ref(cls)
        for item in items:
            self.visit(item)

    def mapping(self, items: list[tuple[Any, Any]], cls: str | None) -> None:
        if cls is not None:
            self.class_ref(cls)
        for key, value in items:
            self.visit(key)
            self.visit(value)

    def default_mapping(self, items: list[tuple[Any, Any]], factory: Any, cls: str | None) -> None:
        self.mapping(items, cls)
        self.visit(factory)

    def set_value(self, items: list[Any], frozen: bool, cls: str | None) -> None:
        if cls is not None:
            self.class_ref(cls)
        for item in items:
            self.visit(item)

    def range_value(self, start: int, stop: int, step: int) -> None:
        pass

    def path(self, cls: str, text: str) -> None:
        self.class_ref(cls)

    def datetime_value(self, cls: str, iso: str) -> None:
        self.class_ref(cls)

    def timedelta_value(self, days: int, seconds: int, microseconds: int) -> None:
        pass

    def record(self, kind: ValueKind, cls: str, fields: dict[str, Any]) -> None:
        self.class_ref(cls)
        for value in fields.values():
            self.visit(value)

    def object_state(self, cls: str, state: dict[str, Any]) -> None:
        self.class_ref(cls)
        for value in state.values():
            self.visit(value)

    def module(self, spec: ModuleSpec) -> None:
        self.class_ref(spec.cls)
        for arg in spec.args:
            self.visit(arg)
        for value in spec.kwargs.values():
            self.visit(value)

    def unrecorded(self, type_path: str, text: str, why: str, at: str = "") -> None:
        pass


class _TensorCollector(SpecWalker):
    def __init__(self) -> None:
        self.found: list[TensorSpec] = []

    def tensor(self, spec: TensorSpec) -> None:
        self.found.append(spec)


class _ClassModuleCollector(SpecWalker):
    def __init__(self) -> None:
        self.found: set[str] = set()

    def class_ref(self, path: str) -> None:
        if ":" in path:
            self.found.add(path.split(":", 1)[0])


def tensor_leaves(spec: Any) -> list[TensorSpec]:
    """Every tensor inside a spec, in stored order."""
    collector = _TensorCollector()
    collector.visit(spec)
    return collector.found


def referenced_modules(spec: Any) -> set[str]:
    """Names of the modules defining every class and function a spec refers to."""
    collector = _ClassModuleCollector()
    collector.visit(spec)
    return collector.found
