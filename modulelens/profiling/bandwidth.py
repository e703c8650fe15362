"""This machine's copy bandwidth, measured once and cached per machine: the roofline's ceiling
for memory-bound operators."""

from __future__ import annotations

import json
import os
import platform
import socket
from pathlib import Path

import torch

from modulelens.device import is_cuda, runs_here
from modulelens.timing import time_callable


def _cache_file() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "modulelens" / "machine.json"


def machine_key(device: str) -> str:
    if is_cuda(device):
        name = torch.cuda.get_device_name(torch.device(device))
    else:
        name = platform.processor() or platform.machine()
    return f"{socket.gethostname()}|{device}|{name}|threads={torch.get_num_threads()}"


def copy_bandwidth(device: str = "cpu", nbytes: int | None = None, refresh: bool = False) -> dict:
    """Bytes per second of ``dst.copy_(src)`` counting read + write, on a buffer far larger than
    the caches. Returns {"bytes_per_s", "buffer_bytes", "measured_at", "cached"}."""
    path = _cache_file()
    key = machine_key(device)
    data = {}
    if path.is_file():
        try:
            data = json.loads(path.read_text())
        except (json.JSONDecodeError, OSError):  # unreadable (a confined checker): measured again
            data = {}
    if key in data and not refresh:
        return {**data[key], "cached": True}
    nbytes = nbytes or ((1 << 30) if is_cuda(device) else (256 << 20))
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    t = time_callable(lambda: dst.copy_(src), device, min_run_time=0.5, warmup=2)
    entry = {"bytes_per_s": 2 * nbytes / t.median_s, "buffer_bytes": nbytes, "median_s": t.median_s}
    data[key] = entry
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=2))
        os.replace(tmp, path)
    except OSError:  # not writable here (a confined checker): used, not kept
        pass
    return {**entry, "cached": False}


def copy_bytes_per_s(device: str) -> float | None:
    """:func:`copy_bandwidth` of ``device`` in bytes per second, or None when the device is not on
    this machine (a CUDA opset read on a machine without a GPU: described, not measured)."""
    if not runs_here(device):
        return None
    return copy_bandwidth(device)["bytes_per_s"]
