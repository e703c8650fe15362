"""Modules that only wrap the user's model: DDP, DataParallel, FSDP and ``torch.compile``'s
``OptimizedModule``. Capture and statistics both skip them when naming and ordering modules."""

from __future__ import annotations

from typing import Any

WRAPPER_CLASSES: frozenset[str] = frozenset(
    {"DistributedDataParallel", "DataParallel", "FullyShardedDataParallel", "OptimizedModule"}
)


def is_wrapper(module: Any) -> bool:
    """True for an instance of one of :data:`WRAPPER_CLASSES` (matched by class name, so no
    distributed or dynamo import is needed)."""
    return type(module).__name__ in WRAPPER_CLASSES


def unwrap(module: Any) -> Any:
    """The user's model inside any number of wrappers (``.module`` / ``._orig_mod``)."""
    while is_wrapper(module):
        inner = getattr(module, "module", None) or getattr(module, "_orig_mod", None)
        if inner is None:
            break
        module = inner
    return module
