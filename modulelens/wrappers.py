"""Modules that only wrap the user's model: DDP, DataParallel, FSDP, ``torch.compile``'s
``OptimizedModule`` and ``checkpoint_wrapper``, and the names they add to module paths. Capture and
statistics both skip them when naming and ordering modules."""

from __future__ import annotations

from typing import Any

WRAPPER_CLASSES: frozenset[str] = frozenset(
    {"DistributedDataParallel", "DataParallel", "FullyShardedDataParallel", "OptimizedModule", "CheckpointWrapper"}
)
# Attributes under which a wrapper holds the module it wraps.
_INNER = ("module", "_orig_mod", "_checkpoint_wrapped_module")
# Names wrappers put in front of a path (DDP's ``module.``) or anywhere inside it (torch.compile of a
# submodule, FSDP1, checkpoint_wrapper).
WRAPPER_PREFIXES = ("module.", "_orig_mod.", "_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")
WRAPPER_SEGMENTS = frozenset({"_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module"})


def is_wrapper(module: Any) -> bool:
    """True for an instance of one of :data:`WRAPPER_CLASSES` (matched by class name, so no
    distributed or dynamo import is needed)."""
    return type(module).__name__ in WRAPPER_CLASSES


def unwrap(module: Any) -> Any:
    """The user's model inside any number of wrappers."""
    while is_wrapper(module):
        inner = next((getattr(module, a) for a in _INNER if getattr(module, a, None) is not None), None)
        if inner is None:
            break
        module = inner
    return module


def strip_wrapper_prefix(name: str) -> str:
    """The module's name as the user's model names it: without the names that wrappers put in
    front of or inside it."""
    name = ".".join(part for part in name.split(".") if part not in WRAPPER_SEGMENTS)
    changed = True
    while changed:
        changed = False
        for p in WRAPPER_PREFIXES:
            if name.startswith(p):
                name, changed = name[len(p):], True
            elif name == p[:-1]:
                name, changed = "", True
    return name
