"""The *leaves* calling convention: a captured call as a function of tensors only.

torch.export takes only pytrees of tensors and plain values, but real calls take cache objects
(transformers' ``DynamicCache``), dataclasses and user classes holding tensors. :class:`LeafCall`
wraps the captured module: it takes the tensor leaves of the call's inputs (in the order of
``input_keys``, the keys the capture gives them), rebuilds the arguments around them from the
recorded specs, calls the module, and returns the tensor leaves of the output and of the inputs
the call changed (``returned_keys``). It is what the export strategy exports.

:class:`LeafProgramCall` is the other side: it makes an exported ``LeafCall`` program callable
like the original module again (``module(*args, **kwargs)`` returns the structured output), and
keeps the inputs' state after the call for comparison.

State of the call (:func:`call_state`): the tensors of the inputs after the call (by key) and the
module's buffers (``module.<name>``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

from modulelens.capture.spec import TensorSpec
from modulelens.capture.spec_walk import tensor_leaves
from modulelens.capture.values import Decoder, TensorSource, keyed_tensors

BUFFER_PREFIX = "module."
"""Keys of the module's buffers in a call's state."""

INNER = "inner."
"""The prefix the wrapped module's parameters and buffers get inside an exported LeafCall."""

LEAF_PROGRAM_PREFIX = "program." + INNER
"""The prefix they get inside a :class:`LeafProgramCall`."""


class LeafSource(TensorSource):
    """Gives the tensors passed in, by key, unchanged (no copy, no cast)."""

    def __init__(self, tensors: dict[str, torch.Tensor]):
        super().__init__(tensors)

    def get(self, spec: TensorSpec) -> torch.Tensor:
        return self.tensors[spec.key]


class SharingLeafSource(LeafSource):
    """Gives the tensors passed in, and those that shared memory in the run (spec ``storage``) as
    strided views of one new buffer per storage, their values written into it with traceable
    operations: an exported program rebuilds the relations inside itself, whatever its inputs'
    layout, so in-place writes reach every alias as they did in the run."""

    def get(self, spec: TensorSpec) -> torch.Tensor:
        t = self.tensors[spec.key]
        slot = spec.storage
        if slot is None or spec.stride is None or list(t.shape) != spec.shape:
            return t
        buffer = self.storages.get(slot.id)
        if buffer is None:
            buffer = self.storages[slot.id] = t.new_zeros(slot.span)
        where = torch.arange(slot.span, device=t.device).as_strided(spec.shape, spec.stride, slot.offset)
        buffer.index_put_((where.reshape(-1),), t.reshape(-1))
        return buffer.as_strided(spec.shape, spec.stride, slot.offset)


def input_keys(args_spec: Any, kwargs_spec: Any) -> list[str]:
    """Keys of every input tensor of a call, positional ones first: the LeafCall argument order."""
    return [t.key for t in tensor_leaves(args_spec) + tensor_leaves(kwargs_spec)]


def call_state(module: nn.Module, args: Any, kwargs: Any) -> dict[str, torch.Tensor]:
    """The tensors of a call's inputs (keyed like the capture's) and the module's buffers, as they
    are now: after the call, this is the state it may have changed."""
    _, state = keyed_tensors(list(args), "args")
    state.update(keyed_tensors(dict(kwargs), "kwargs")[1])
    state.update({BUFFER_PREFIX + name: b for name, b in module.named_buffers()})
    return state


def changed_state(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Entries of ``after`` that are new or differ from ``before`` (shape, dtype or any value)."""
    changed = {}
    for key, t in after.items():
        old = before.get(key)
        t = t.detach()
        if old is None or old.shape != t.shape or old.dtype != t.dtype or not torch.equal(old, t.to(old.device)):
            changed[key] = t
    return changed


class LeafCall(nn.Module):
    """``inner`` called with arguments rebuilt around tensor leaves; returns the leaves of
    ``returned_keys`` (output tensors, then changed input tensors), in that order."""

    def __init__(self, inner: nn.Module, args_spec: Any, kwargs_spec: Any, returned_keys: list[str],
                 resolve: Callable[[str], Any]):
        super().__init__()
        self.inner = inner
        self.args_spec, self.kwargs_spec = args_spec, kwargs_spec
        self.input_keys = input_keys(args_spec, kwargs_spec)
        self.returned_keys = list(returned_keys)
        self._resolve = resolve
        specs = tensor_leaves(args_spec) + tensor_leaves(kwargs_spec)
        self._activations = {s.key for s in specs if not s.leaf}

    def forward(self, *leaves: torch.Tensor) -> tuple[torch.Tensor, ...]:
        # Inputs that were activations in the run (not autograd leaves) are cloned, as they were
        # computed there: the module may change them in place, and the program returns them changed.
        given = {k: (t.clone() if k in self._activations else t) for k, t in zip(self.input_keys, leaves)}
        decoder = Decoder(SharingLeafSource(given), self._resolve)
        args, kwargs = decoder.decode(self.args_spec), decoder.decode(self.kwargs_spec)
        out = self.inner(*args, **kwargs)
        _, found = keyed_tensors(out, "output")
        found.update(call_state(nn.Module(), args, kwargs))
        missing = [k for k in self.returned_keys if k not in found]
        if missing:
            raise RuntimeError(f"the call did not produce {', '.join(missing[:3])}")
        return tuple(found[k] for k in self.returned_keys)


class LeafProgramCall(nn.Module):
    """An exported LeafCall program, callable as the original module: ``forward(*args, **kwargs)``
    passes the inputs' tensor leaves to the program and rebuilds the structured output from the
    capture's output spec. The inputs' state after the call is in :attr:`last_state`."""

    def __init__(self, program: nn.Module, input_keys: list[str], returned_keys: list[str], output_spec: Any,
                 resolve: Callable[[str], Any]):
        super().__init__()
        self.program = program
        self.input_keys, self.returned_keys = list(input_keys), list(returned_keys)
        self.output_spec = output_spec
        self._resolve = resolve
        self.last_state: dict[str, torch.Tensor] = {}

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        given = call_state(nn.Module(), args, kwargs)
        missing = [k for k in self.input_keys if k not in given]
        if missing:
            raise ValueError(f"the call has no input {missing[0]!r} that the exported program takes")
        returned = dict(zip(self.returned_keys, self.program(*(given[k] for k in self.input_keys))))
        self.last_state = {k: v for k, v in returned.items() if not k.startswith("output")}
        outputs = {k: v for k, v in returned.items() if k.startswith("output")}
        return Decoder(_OutputSource(outputs), self._resolve).decode(self.output_spec)



def replayed_state(module: nn.Module, args: Any, kwargs: Any) -> dict[str, torch.Tensor]:
    """The state after a replayed call, keyed like the capture's ``state_after``: the inputs' tensors
    and the module's buffers (for an exported program, what it returned and its buffers)."""
    if not isinstance(module, LeafProgramCall):
        return call_state(module, args, kwargs)
    state = dict(module.last_state)
    state.update({BUFFER_PREFIX + n[len(LEAF_PROGRAM_PREFIX):]: b for n, b in module.named_buffers()
                  if n.startswith(LEAF_PROGRAM_PREFIX)})
    return state


class _OutputSource(LeafSource):
    """Output tensors the program returned; outputs it did not return are ``None`` (an output that
    is not a tensor-valued leaf of the call)."""

    def get(self, spec: TensorSpec) -> Any:
        return self.tensors.get(spec.key)


def export_leaf_call(module: nn.Module, args_spec: Any, kwargs_spec: Any, leaves: dict[str, torch.Tensor],
                     returned_keys: list[str]) -> Any:
    """``torch.export`` the LeafCall of ``module`` on ``leaves`` (input tensors by key); raises
    what torch.export raises."""
    from modulelens.capture.sources import Resolver

    call = LeafCall(module, args_spec, kwargs_spec, returned_keys, Resolver())
    return torch.export.export(call, tuple(leaves[k] for k in call.input_keys), strict=False)
