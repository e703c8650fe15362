"""Exact call patterns: what a pack entry was validated for, and the key a live call is matched by.

A :class:`CallPattern` describes one call completely: every positional and keyword argument (a
tensor by shape, strides, dtype and device type; a list item by item; any other value by type and
value), the grad mode and the training flag (of the module, for module entries; of the model
running, for operator entries). It is stored in the pack as JSON. :func:`pattern_keys` turns a
stored pattern into the hashable keys it admits, and :func:`call_key` computes the key of a live
call; a call is dispatched to a pack kernel only when its key is one of them (or fits the entry's
shape rule, :mod:`modulelens.dispatch.rules`), so anything that differs (another shape, dtype,
stride, device, a different scalar argument, grad mode, inference mode, training flag) runs eager.
A unit test checks that both functions agree on the same call.

The mode is one of grad mode on, grad mode off, inference mode. A pattern validated with grad mode
off also admits inference mode: the kernel computes the same thing, and no autograd is involved in
either; one validated with grad mode on admits only grad mode on.

``1``, ``1.0`` and ``True`` compare equal in Python; the keys carry the value's type, so they do
not match each other here.
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import BaseModel, Field

from modulelens.capture import dtype_name, parse_dtype

_PRIMITIVES = frozenset({bool, int, float, str, type(None)})


class CallPattern(BaseModel):
    """One exact call: its arguments (see :func:`describe_value`), grad mode, and the training
    flag (of the module called, or for operator entries of the model it ran in; None: not guarded,
    as in packs written before operator entries recorded it)."""

    args: list[Any] = Field(default_factory=list)
    kwargs: dict[str, Any] = Field(default_factory=dict)
    grad_enabled: bool
    training: bool | None = None


def describe_value(value: Any) -> Any:
    """JSON description of one argument: ``{"tensor": {shape, stride, dtype, device}}``,
    ``{"list": [...]}`` or ``{"value": v, "type": name}`` (values of other types than bool, int,
    float, str and None as their str, under their type's name)."""
    if isinstance(value, torch.Tensor):
        return {"tensor": {"shape": list(value.shape), "stride": list(value.stride()),
                           "dtype": dtype_name(value.dtype), "device": value.device.type}}
    kind = type(value)
    if kind is list or kind is tuple:
        return {"list": [describe_value(v) for v in value]}
    return {"value": value if kind in _PRIMITIVES else str(value), "type": kind.__name__}


def describe_call(args: list | tuple, kwargs: dict[str, Any], *, grad_enabled: bool,
                  training: bool | None = None) -> CallPattern:
    return CallPattern(args=[describe_value(a) for a in args], kwargs={k: describe_value(v) for k, v in kwargs.items()},
                       grad_enabled=grad_enabled, training=training)


# The live side runs on every call of a packed operator: plain loops, no generator expressions.
_Tensor = torch.Tensor
_is_grad_enabled = torch.is_grad_enabled
_is_inference = torch.is_inference_mode_enabled
GRAD_OFF, GRAD_ON, INFERENCE = 0, 1, 2
MODE_NAMES = {GRAD_OFF: "grad mode off", GRAD_ON: "grad mode on", INFERENCE: "inference mode"}


def _value_key(value: Any) -> Any:
    if isinstance(value, _Tensor):
        return ("T", value.shape, value.stride(), value.dtype, value.device.type)
    kind = type(value)
    if kind is list or kind is tuple:
        return ("L", tuple([_value_key(v) for v in value]))
    return (kind.__name__, value if kind in _PRIMITIVES else str(value))


def _described_key(desc: Any) -> Any:
    if "tensor" in desc:
        t = desc["tensor"]
        return ("T", tuple(t["shape"]), tuple(t["stride"]), parse_dtype(t["dtype"]), t["device"])
    if "list" in desc:
        return ("L", tuple(_described_key(v) for v in desc["list"]))
    return (desc["type"], desc["value"])


def call_key(args: tuple | list, kwargs: dict[str, Any], training: bool | None = None) -> tuple:
    """The key of a live call (mode read now)."""
    return (INFERENCE if _is_inference() else int(_is_grad_enabled()), training, tuple([_value_key(a) for a in args]),
            tuple([(k, _value_key(v)) for k, v in kwargs.items()]) if kwargs else ())


def pattern_key(pattern: CallPattern) -> tuple:
    """The key of the call ``pattern`` describes (in its own grad mode)."""
    return (int(pattern.grad_enabled), pattern.training, tuple(_described_key(a) for a in pattern.args),
            tuple((k, _described_key(v)) for k, v in pattern.kwargs.items()))


def pattern_keys(pattern: CallPattern) -> list[tuple]:
    """Every key a live call may have to match ``pattern`` (grad mode off admits inference mode too)."""
    key = pattern_key(pattern)
    return [key] if pattern.grad_enabled else [key, (INFERENCE, *key[1:])]


def _describe_key_value(key: Any) -> str:
    if key[0] == "T":
        _, shape, stride, dtype, device = key
        return f"{device} {dtype_name(dtype)} tensor {list(shape)} strides {list(stride)}"
    if key[0] == "L":
        return "[" + ", ".join(_describe_key_value(k) for k in key[1]) + "]"
    return repr(key[1])


def _tensor_difference(got: tuple, want: tuple) -> str:
    names = ("shape", "strides", "dtype", "device")
    for name, g, w in zip(names, got[1:], want[1:]):
        if g != w:
            show = (lambda x: dtype_name(x)) if name == "dtype" else (lambda x: list(x) if isinstance(x, tuple) else x)
            return f"{name} {show(g)} (validated: {show(w)})"
    return ""


def value_difference(where: str, got: Any, want: Any) -> str | None:
    if got == want:
        return None
    if got[0] == "T" and want[0] == "T":
        return f"{where}: {_tensor_difference(got, want)}"
    if got[0] == "L" and want[0] == "L" and len(got[1]) == len(want[1]):
        for i, (g, w) in enumerate(zip(got[1], want[1])):
            d = value_difference(f"{where}[{i}]", g, w)
            if d:
                return d
    return f"{where}: {_describe_key_value(got)} (validated: {_describe_key_value(want)})"


def difference(key: tuple, validated: tuple) -> str:
    """Why a call's key does not match a validated key, in a few words (the first difference)."""
    grad, training, args, kwargs = key
    v_grad, v_training, v_args, v_kwargs = validated
    if grad != v_grad and not (grad == INFERENCE and v_grad == GRAD_OFF):
        return f"{MODE_NAMES[grad]} (validated: {MODE_NAMES[v_grad]})"
    if training != v_training:
        if training is None:
            return f"no model's training flag known (validated: training={v_training})"
        return f"training={training} (validated: training={v_training})"
    if len(args) != len(v_args) or [k for k, _ in kwargs] != [k for k, _ in v_kwargs]:
        return "different arguments given"
    for i, (g, w) in enumerate(zip(args, v_args)):
        d = value_difference(f"argument {i}", g, w)
        if d:
            return d
    for (name, g), (_, w) in zip(kwargs, v_kwargs):
        d = value_difference(f"argument {name}", g, w)
        if d:
            return d
    return "no difference found"


def distance(key: tuple, validated: tuple) -> int:
    """How many top-level parts differ (to attribute a miss to the closest entry)."""
    grad, training, args, kwargs = key
    v_grad, v_training, v_args, v_kwargs = validated
    n = (grad != v_grad) + (training != v_training) + abs(len(args) - len(v_args)) + abs(len(kwargs) - len(v_kwargs))
    return n + sum(g != w for g, w in zip(args, v_args)) + sum(g != w for g, w in zip(kwargs, v_kwargs))
