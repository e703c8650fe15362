"""Modules whose parameters are sharded DTensors (FSDP2's ``fully_shard``, tensor parallelism).

Outside its forward, an FSDP2 module holds each parameter as a DTensor sharded over the ranks; its
forward pre-hook gathers them (a collective every rank joins) and registers the whole tensors for
the duration of the call. The capture therefore reads such parameters *inside* the call, from a
forward pre-hook that runs after FSDP's (:func:`read_inside_call`): it gets the whole values without
a collective of its own. To export the call afterwards, on this rank alone, the module's sharded
parameters are replaced by plain ones holding those values and FSDP's forward hooks are set aside
(:func:`substituted`, :func:`gathered`), so tracing never starts a collective the other ranks would
not join.

A DTensor that stays sharded during the call (tensor parallelism) cannot be gathered without every
rank: its local shard is what is stored, and the capture says so.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn as nn


def is_dtensor(t: Any) -> bool:
    return type(t).__name__ == "DTensor"


def is_sharded(t: Any) -> bool:
    """A DTensor spread over more than one rank."""
    return is_dtensor(t) and t.device_mesh.size() > 1


def plain(t: torch.Tensor) -> torch.Tensor:
    """``t`` detached, as a plain tensor (no copy): a DTensor's whole value when its mesh has one
    rank, else its local shard."""
    t = t.detach()
    if is_dtensor(t):
        t = t.full_tensor() if t.device_mesh.size() == 1 else t.to_local()
    return t


def read_inside_call(module: nn.Module, names: list[str], read: Callable[[str, torch.Tensor], None]) -> Any:
    """Register a one-shot forward pre-hook on ``module`` that passes the parameters ``names`` to
    ``read(name, tensor)`` as they are when the forward starts (after FSDP gathered them). Returns
    the hook handle (the hook removes itself)."""
    handle = None

    def pre_hook(mod: nn.Module, args: Any) -> None:
        params = dict(mod.named_parameters())
        for name in names:
            if name in params:
                read(name, params[name])
        if handle is not None:
            handle.remove()

    handle = module.register_forward_pre_hook(pre_hook)
    return handle


def _is_fsdp_hook(hook: Any) -> bool:
    owner = getattr(hook, "__self__", None)
    return owner is not None and type(owner).__name__ == "FSDPState"


@contextlib.contextmanager
def substituted(module: nn.Module, values: dict[str, torch.Tensor]) -> Iterator[None]:
    """Within the block, ``module``'s parameters and buffers named in ``values`` (qualified names)
    are those tensors, registered as given (no copy), and FSDP's forward hooks of ``module`` and its
    submodules are set aside, so that calling it starts no collective. Everything is put back
    afterwards. Used to export a sharded module on one rank (the gathered values) and to run the
    module again on the weights of the captured call."""
    swapped: list[tuple[dict, str, Any]] = []
    hooks: list[tuple[nn.Module, str, OrderedDict]] = []
    try:
        for qual, value in values.items():
            owner_name, _, leaf = qual.rpartition(".")
            owner = module.get_submodule(owner_name)
            for table in (owner._parameters, owner._buffers):
                if leaf in table:
                    swapped.append((table, leaf, table[leaf]))
                    table[leaf] = value
                    break
        for sub in module.modules():
            for attr in ("_forward_pre_hooks", "_forward_hooks"):
                table = getattr(sub, attr)
                if any(_is_fsdp_hook(h) for h in table.values()):
                    hooks.append((sub, attr, table))
                    object.__setattr__(sub, attr, OrderedDict((k, h) for k, h in table.items() if not _is_fsdp_hook(h)))
        yield
    finally:
        for sub, attr, table in hooks:
            object.__setattr__(sub, attr, table)
        for table, leaf, before in reversed(swapped):
            table[leaf] = before


def gathered(module: nn.Module, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Plain parameters holding the captured whole values of ``module``'s sharded parameters (on
    their devices), for :func:`substituted`."""
    return {name: nn.Parameter(weights[name].to(p.device), p.requires_grad)
            for name, p in module.named_parameters() if is_sharded(p) and name in weights}
