"""PyTorch's process-wide numeric settings: the switches that change which kernels compute a call
and how they round (oneDNN on CPU, TF32 and reduced-precision reductions on GPU, the float32
matmul precision, deterministic algorithms).

A capture records them; a replay runs under the recorded ones and restores the process's own after,
so a call captured with oneDNN disabled (or TF32 enabled) replays bit for bit in a process that
set otherwise, and the replay says which it changed.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import torch

SettingValue = bool | str


def _flags() -> dict[str, tuple[object, str]]:
    """Each setting's name → (the object holding it, the attribute)."""
    return {
        "mkldnn": (torch.backends.mkldnn, "enabled"),
        "cuda_matmul_allow_tf32": (torch.backends.cuda.matmul, "allow_tf32"),
        "cudnn_allow_tf32": (torch.backends.cudnn, "allow_tf32"),
        "cuda_matmul_fp16_reduced_precision": (torch.backends.cuda.matmul, "allow_fp16_reduced_precision_reduction"),
        "cuda_matmul_bf16_reduced_precision": (torch.backends.cuda.matmul, "allow_bf16_reduced_precision_reduction"),
    }


def current_settings() -> dict[str, SettingValue]:
    """The settings in force in this process now, by name."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        values: dict[str, SettingValue] = {name: bool(getattr(obj, attr)) for name, (obj, attr) in _flags().items()}
        values["float32_matmul_precision"] = torch.get_float32_matmul_precision()
        values["deterministic_algorithms"] = torch.are_deterministic_algorithms_enabled()
    return values


def _set(name: str, value: SettingValue) -> None:
    flags = _flags()
    if name in flags:
        obj, attr = flags[name]
        setattr(obj, attr, bool(value))
    elif name == "float32_matmul_precision":
        torch.set_float32_matmul_precision(str(value))
    elif name == "deterministic_algorithms":
        torch.use_deterministic_algorithms(bool(value))


def differences(recorded: dict[str, SettingValue]) -> dict[str, tuple[SettingValue, SettingValue]]:
    """Name → (recorded, here) for each recorded setting this process holds otherwise (names this
    version of PyTorch does not know are left out)."""
    here = current_settings()
    return {name: (value, here[name]) for name, value in recorded.items() if name in here and here[name] != value}


@contextmanager
def recorded_settings(recorded: dict[str, SettingValue]) -> Iterator[dict[str, tuple[SettingValue, SettingValue]]]:
    """Run the block under the recorded settings, restoring this process's own after it (also when it
    raises); yields what was changed (name → (recorded, here))."""
    changed = differences(recorded)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            for name, (value, _) in changed.items():
                _set(name, value)
            yield changed
        finally:
            for name, (_, own) in changed.items():
                _set(name, own)


def describe_settings(changed: dict[str, tuple[SettingValue, SettingValue]]) -> str:
    """``mkldnn False (this process: True)`` for each changed setting, joined."""
    return ", ".join(f"{name} {value} (this process: {own})" for name, (value, own) in changed.items())
