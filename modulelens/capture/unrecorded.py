"""Values a capture could not record, and what each of them costs.

A constructor argument of a type the encoder cannot store (a lambda, a set of an unknown class,
a lock) does not have to cost source replay: replay rebuilds the module with a placeholder that
fails, naming the value, only when used (:class:`~modulelens.capture.values.UnrecordedValue`).
To say in advance whether it will be used, the capture watches attribute reads during the captured
call (:func:`watching_reads`) on the object attributes that hold such values: the innermost object
attribute holding it (a config field) and any attribute of the module or its submodules that holds
the same object. A value the call reads blocks source replay; one it does not read is reported with
what would happen if the constructor used it.

The watch patches ``__getattribute__`` of the watched objects' classes for its duration and counts
only reads on the watched instances; classes that cannot be patched (built-in or extension types)
report every watched attribute as read, so the answer errs on the safe side.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch.nn as nn

from modulelens.capture.manifest import UnrecordedField
from modulelens.capture.values import Unrecorded

_MISSING = object()


@contextlib.contextmanager
def watching_reads(watched: list[tuple[Any, str]]) -> Iterator[set[tuple[int, str]]]:
    """Within the block, note reads of attribute ``name`` on ``obj`` for each ``(obj, name)`` given.
    Yields the set of ``(id(obj), name)`` read (filled as the block runs; complete after it)."""
    read: set[tuple[int, str]] = set()
    wanted: dict[type, dict[int, set[str]]] = {}
    for obj, name in watched:
        wanted.setdefault(type(obj), {}).setdefault(id(obj), set()).add(name)
    patched: list[tuple[type, Any]] = []
    try:
        for cls, by_object in wanted.items():
            if not _patch(cls, by_object, read, patched):
                read.update((oid, name) for oid, names in by_object.items() for name in names)
        yield read
    finally:
        for cls, before in reversed(patched):
            if before is _MISSING:
                type.__delattr__(cls, "__getattribute__")
            else:
                type.__setattr__(cls, "__getattribute__", before)


def _patch(cls: type, by_object: dict[int, set[str]], read: set[tuple[int, str]],
           patched: list[tuple[type, Any]]) -> bool:
    """Route attribute reads of ``cls`` instances through a counter; False when it cannot."""
    original = cls.__getattribute__
    before = cls.__dict__.get("__getattribute__", _MISSING)

    def __getattribute__(self: Any, name: str) -> Any:
        names = by_object.get(id(self))
        if names is not None and name in names:
            read.add((id(self), name))
        return original(self, name)

    try:
        type.__setattr__(cls, "__getattribute__", __getattribute__)
    except (TypeError, AttributeError):
        return False
    patched.append((cls, before))
    return True


def watch_points(module: nn.Module, found: list[Unrecorded]) -> list[tuple[Any, str, int]]:
    """Where reads of each unrecorded constructor value can be seen: ``(object, attribute, index in
    found)`` for its innermost owner's attribute and for every attribute of ``module`` and its
    submodules that holds the same object."""
    points = [(u.owner, u.attribute, i) for i, u in enumerate(found) if u.owner is not None]
    by_id = {id(u.value): i for i, u in enumerate(found) if u.value is not None}
    for sub in module.modules():
        for name, value in vars(sub).items():
            if id(value) in by_id:
                points.append((sub, name, by_id[id(value)]))
    return points


_INPUT_PREFIXES = ("args", "kwargs")


def describe(found: list[Unrecorded], read: set[int] | None, watched: set[int]) -> list[UnrecordedField]:
    """What each unrecorded value blocks. ``read`` holds the indexes (in ``found``) of constructor
    values the captured call read and ``watched`` those whose reads could be seen; ``read`` None for
    values that are not constructor arguments (inputs, outputs)."""
    fields = []
    for i, u in enumerate(found):
        top = u.path.split(".", 1)[0]
        if top in _INPUT_PREFIXES:
            blocks, effect, was_read = ["source", "export"], "an input of the call: neither strategy can rebuild the call", None
        elif top == "output":
            blocks, effect, was_read = ["comparison"], "part of the output: it is not compared on replay", None
        elif read is not None and i in read:
            blocks, effect, was_read = ["source"], "the captured call reads it: source replay is unavailable", True
        elif i in watched:
            blocks, effect, was_read = [], ("the captured call does not read it: source replay rebuilds the module "
                                            "without it, and fails naming it only if the constructor uses it"), False
        else:
            blocks, effect, was_read = [], ("its reads cannot be watched: source replay fails naming it if the "
                                            "rebuilt module uses it"), None
        fields.append(UnrecordedField(path=u.path, type=u.type, repr=u.repr, why=u.why, blocks=blocks,
                                      read_by_call=was_read, effect=effect))
    return fields
