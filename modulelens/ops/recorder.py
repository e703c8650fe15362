"""Record and time the aten operators a run executes, grouped into variants.

A *variant* is one operator overload called with one combination of input shapes, dtypes,
strides, devices and non-tensor arguments: calls of one variant can be served by the same kernel.
:class:`OpRecorder` counts calls per variant and keeps up to K sample calls (inputs snapshotted
before the call, outputs after: the eager oracle). :class:`OpTimer` measures the time spent inside
each variant's calls during a run.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from modulelens.device import is_cuda

# Operators whose cost is dominated by arithmetic (vendor libraries usually serve them well).
_COMPUTE_NAMES = {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "addmv", "mv", "dot", "einsum", "_addmm_activation"}
_COMPUTE_PREFIXES = ("convolution", "_convolution", "conv", "cudnn_", "mkldnn_", "_scaled_dot_product",
                     "scaled_dot_product", "_flash_attention", "_efficient_attention")
_VIEW_NAMES = {"detach", "_unsafe_view", "alias", "lift_fresh", "_reshape_alias"}
# Operators whose output holds uninitialised memory: only its metadata can be reproduced.
_UNINITIALISED = {"empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided", "empty_permuted"}


def uninitialised_output(func: Any) -> bool:
    return func.name().split("::")[-1].split(".")[0] in _UNINITIALISED


def op_name(func: Any) -> str:
    """``aten.addmm.default`` style name of an OpOverload."""
    return str(func)


def resolve_op(name: str) -> Any:
    """Inverse of :func:`op_name`."""
    ns, _, rest = name.partition(".")
    packet_name, _, overload = rest.rpartition(".")
    packet = getattr(getattr(torch.ops, ns), packet_name)
    return getattr(packet, overload)


def tensor_desc(t: torch.Tensor) -> dict[str, Any]:
    return {
        "shape": list(t.shape),
        "dtype": str(t.dtype).removeprefix("torch."),
        "stride": list(t.stride()) if t.layout == torch.strided else None,
        "contiguous": t.is_contiguous(),
        "device": str(t.device),
    }


def _nontensor(v: Any) -> Any:
    if isinstance(v, (int, float, bool, str)) or v is None:
        return v
    return str(v)


def variant_key(func: Any, args: tuple, kwargs: dict) -> tuple[str, list[dict[str, Any]], list[Any]]:
    leaves, spec = tree_flatten((args, kwargs))
    tensors = [tensor_desc(x) for x in leaves if isinstance(x, torch.Tensor)]
    others = [_nontensor(x) for x in leaves if not isinstance(x, torch.Tensor)]
    key = json.dumps([op_name(func), tensors, others, str(spec)], default=str)
    return key, tensors, others


def classify(func: Any) -> str:
    """``view`` (metadata only), ``compute`` (matrix products, convolutions, attention) or ``memory``."""
    base = func.name().split("::")[-1].split(".")[0]
    if getattr(func, "is_view", False) or base in _VIEW_NAMES:
        return "view"
    if base in _COMPUTE_NAMES or base.startswith(_COMPUTE_PREFIXES):
        return "compute"
    return "memory"


@dataclass
class Sample:
    args: tuple
    kwargs: dict
    output: Any
    rng: torch.Tensor | None = None  # CPU RNG state before the call, for random operators


@dataclass
class Variant:
    key: str
    op: str
    kind: str
    phase: str
    tensors: list[dict[str, Any]]
    others: list[Any]
    calls: int = 0
    first_seen: int = 0
    samples: list[Sample] = field(default_factory=list)
    bytes_per_call: int = 0
    uninitialised: bool = False


def _clone(x: Any) -> Any:
    return tree_map(lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, x)


def _bytes(x: Any) -> int:
    leaves, _ = tree_flatten(x)
    seen, total = set(), 0
    for t in leaves:
        if isinstance(t, torch.Tensor) and t.layout == torch.strided:
            try:
                key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
            except (RuntimeError, NotImplementedError):
                key = id(t)
            if key not in seen:
                seen.add(key)
                total += t.numel() * t.element_size()
    return total


class OpRecorder(TorchDispatchMode):
    """Counts calls per variant and keeps up to ``samples`` sample calls of each."""

    def __init__(self, samples: int = 2):
        super().__init__()
        self.max_samples = samples
        self.variants: dict[str, Variant] = {}
        self.phase = "forward"
        self._order = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        key, tensors, others = variant_key(func, args, kwargs)
        v = self.variants.get(key)
        if v is None:
            v = Variant(key=key, op=op_name(func), kind=classify(func), phase=self.phase, tensors=tensors,
                        others=others, first_seen=self._order, uninitialised=uninitialised_output(func))
            self.variants[key] = v
            self._order += 1
        v.calls += 1
        keep = len(v.samples) < self.max_samples
        snapshot = _clone((args, kwargs)) if keep else None
        rng = torch.random.get_rng_state() if keep and torch.Tag.nondeterministic_seeded in func.tags else None
        out = func(*args, **kwargs)
        if keep:
            v.samples.append(Sample(args=snapshot[0], kwargs=snapshot[1], output=_clone(out), rng=rng))
            v.bytes_per_call = _bytes((args, kwargs)) + _bytes(out)
        return out


class OpTimer(TorchDispatchMode):
    """Adds the wall time of each call to its variant (synchronising CUDA around each call)."""

    def __init__(self):
        super().__init__()
        self.seconds: dict[str, float] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        key, tensors, _ = variant_key(func, args, kwargs)
        cuda = any(is_cuda(t["device"]) for t in tensors)
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = func(*args, **kwargs)
        if cuda:
            torch.cuda.synchronize()
        self.seconds[key] = self.seconds.get(key, 0.0) + time.perf_counter() - t0
        return out
