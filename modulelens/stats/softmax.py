"""Softmax statistics of the modules of a sampled step: how peaked their probability rows are.

A :class:`SoftmaxObserver` (a ``TorchFunctionMode``, active only during the forward pass of a
sampled step) sees every ``softmax`` and ``log_softmax`` call, whatever its spelling
(``torch.softmax``, ``F.softmax``, ``x.softmax``, ``nn.Softmax``), and every
``F.scaled_dot_product_attention`` call, and hands the statistics of its rows to the module that
made the call. Inside ``scaled_dot_product_attention`` the softmax is part of a fused kernel, so
the attention weights ``softmax(q k^T * scale + mask)`` (before dropout) are recomputed from ``q``
and ``k`` for a sample of query rows (about :data:`SDPA_BUDGET` logits per call); calls whose
weights cannot be recomputed (nested tensors) are reported as not observed.

Per row (a probability vector along the softmax dimension) with at least two unmasked entries
(entries whose logit is -inf are masked; rows of one entry say nothing): the entropy divided by
log(number of unmasked entries) (1: uniform, 0: one-hot), the largest probability, and whether it
is at least :data:`ONEHOT_PROB`. A call's vector (:data:`SOFTMAX_FIELDS`) holds their sums, so the
calls of a module merge by addition. Rows past :data:`MAX_ROWS` are sampled evenly.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from modulelens.stats import fused

SOFTMAX_FIELDS = ("rows", "entropy", "max_prob", "onehot", "calls")
ONEHOT_PROB = 0.99
MAX_ROWS = 256  # rows per call (evenly spaced): the means of 256 rows are within a few percent
SDPA_BUDGET = 1 << 16  # logits recomputed per scaled_dot_product_attention call
TINY = 1.2e-38  # the smallest normal float32

_SOFTMAX = {torch.softmax: "softmax", F.softmax: "softmax", torch.Tensor.softmax: "softmax",
            torch.special.softmax: "softmax", torch.log_softmax: "log_softmax", F.log_softmax: "log_softmax",
            torch.Tensor.log_softmax: "log_softmax", torch.special.log_softmax: "log_softmax"}
_SDPA = {F.scaled_dot_product_attention}
_MHA = {F.multi_head_attention_forward}

Vector = torch.Tensor | list[float]
Record = Callable[[str, Vector], None]


class Unobservable(Exception):
    """The softmax of a call cannot be recomputed (the reason is the message)."""


def row_stats(probs: torch.Tensor, count: torch.Tensor | float, keep: torch.Tensor | None = None) -> Vector:
    """The softmax vector of probability rows along the last dimension. ``count``: the number of
    unmasked entries of each row (a number, or a tensor broadcastable to the rows); ``keep``: the
    rows to count (None: those with ``count`` >= 2). Host floats on the CPU, a float64 device
    tensor elsewhere (no synchronisation)."""
    # 0 log 0 = 0. log() of exact zeros (and xlogy) is ten times slower than of the smallest normal number.
    entropy = -(probs * torch.log(probs.clamp_min(TINY))).sum(-1)
    top = probs.amax(-1)
    if isinstance(count, torch.Tensor):
        entropy = entropy / torch.log(count.clamp(min=2))
        ok = count >= 2
        keep = ok if keep is None else keep & ok
    else:
        entropy = entropy / math.log(max(count, 2))
        if count < 2:
            keep = torch.zeros_like(top, dtype=torch.bool)
    fields = torch.stack(torch.broadcast_tensors(torch.ones_like(top), entropy, top, (top >= ONEHOT_PROB).to(top.dtype)))
    fields = fields.reshape(4, -1).to(torch.float64)
    if keep is not None:
        fields = fields * keep.expand(top.shape).reshape(1, -1)
    sums = fields.nan_to_num().sum(-1)
    if sums.device.type == "cpu":
        return [*sums.tolist(), 1.0]
    return torch.cat([sums, torch.ones(1, dtype=torch.float64, device=sums.device)])


def _rows(t: torch.Tensor, dim: int) -> torch.Tensor:
    """The rows of ``t`` along ``dim`` as a (rows, n) view or copy, at most :data:`MAX_ROWS` evenly spaced."""
    t = t.movedim(dim, -1)
    t = t.reshape(-1, t.shape[-1])
    return t[:: -(-t.shape[0] // MAX_ROWS)] if t.shape[0] > MAX_ROWS else t


def _softmax_dim(x: torch.Tensor, args: tuple, kwargs: dict) -> int:
    dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
    if dim is None:  # the legacy implicit dimension of F.softmax
        dim = 0 if x.dim() in (0, 1, 3) else 1
    return int(dim)


def softmax_call(kind: str, args: tuple, kwargs: dict, out: torch.Tensor) -> Vector:
    """The softmax vector of one softmax/log_softmax call from its input and output."""
    x = args[0] if args else kwargs["input"]
    dim = _softmax_dim(x, args, kwargs)
    with torch.no_grad():
        if x.is_floating_point() and x.device.type == "cpu":
            # From the logits: one C pass (the exponentials vectorised by PyTorch), no logarithms.
            host = fused.softmax_rows_cpu(_rows(x.detach(), dim), ONEHOT_PROB)
            if host is not None:
                return [*host, 1.0]
        p = _rows(out.detach(), dim).float()
        if kind == "log_softmax":
            p = p.exp()
        if x.is_floating_point():
            valid = _rows(x.detach(), dim) != -math.inf  # masked entries
            return row_stats(p, valid.sum(-1, dtype=torch.float32))
        return row_stats(p, float(p.shape[-1]))


_CAUSAL: dict[tuple[int, int, int, str], tuple[torch.Tensor, torch.Tensor]] = {}


def _causal(length: int, keys: int, step: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """For query rows 0, step, 2*step...: -inf where a key may not be seen (key > query, as
    is_causal=True aligns them), 0 elsewhere (added to the logits: cheaper than a masked fill), and
    how many keys each row sees."""
    key = (length, keys, step, str(device))
    if key not in _CAUSAL:
        if len(_CAUSAL) > 64:
            _CAUSAL.clear()
        rows = torch.arange(0, length, step, device=device)
        hidden = torch.arange(keys, device=device)[None, :] > rows[:, None]
        _CAUSAL[key] = (torch.zeros(hidden.shape, device=device).masked_fill_(hidden, -math.inf),
                        (rows + 1).clamp(max=keys).to(torch.float32))
    return _CAUSAL[key]


def attention_weights(q: torch.Tensor, k: torch.Tensor, attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0,
                      is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False) -> Vector:
    """The softmax vector of ``scaled_dot_product_attention``'s weights (before dropout),
    recomputed for a sample of query rows (about :data:`SDPA_BUDGET` logits, at most
    :data:`MAX_ROWS` rows)."""
    if q.is_nested or k.is_nested:
        raise Unobservable("nested tensors")
    if attn_mask is None and q.is_cpu and k.is_cpu and q.dim() == 4 and k.dim() == 4 \
            and (not enable_gqa or k.shape[1] == q.shape[1]):
        host = _attention_rows_host(q, k, is_causal, scale)
        if host is not None:
            return host
    with torch.no_grad():
        q, k = q.detach(), k.detach()
        if enable_gqa and q.dim() >= 3 and k.shape[-3] != q.shape[-3]:
            k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
        L, S, E = q.shape[-2], k.shape[-2], q.shape[-1]
        batch = max(math.prod(q.shape[:-2]), math.prod(k.shape[:-2]))
        first = q.shape[0] if q.dim() > 2 else 1
        keep, step = _sample_rows(first, batch // max(first, 1), L, S)
        if keep < first:  # keep the first batch entries
            q = q[:keep]
            k = k[:keep] if k.dim() == q.dim() and k.shape[0] > 1 else k
            if attn_mask is not None and attn_mask.dim() == q.dim() and attn_mask.shape[0] > 1:
                attn_mask = attn_mask[:keep]
        logits = torch.matmul(q[..., ::step, :], k.transpose(-2, -1)).float()
        logits.mul_(scale if scale is not None else 1 / math.sqrt(E))
        count: torch.Tensor | float = float(S)
        if is_causal:
            bias, count = _causal(L, S, step, q.device)
            logits.add_(bias)
        if attn_mask is not None:
            m = attn_mask[..., ::step, :] if attn_mask.dim() >= 2 and attn_mask.shape[-2] == L else attn_mask
            if m.dtype == torch.bool:
                logits = logits.masked_fill(~m, -math.inf)
            else:
                logits = logits + m.float()
            count = (logits != -math.inf).sum(-1, dtype=torch.float32)
        if logits.device.type == "cpu":
            host = fused.softmax_rows_cpu(logits.reshape(-1, logits.shape[-1]), ONEHOT_PROB)
            if host is not None:
                return [*host, 1.0]
        return row_stats(torch.softmax(logits, -1), count)


def _sample_rows(first: int, rest: int, L: int, S: int) -> tuple[int, int]:
    """(how many entries of the first batch dimension to keep, the step between sampled query rows)
    for ``first`` x ``rest`` batch entries of ``L`` queries and ``S`` keys: about :data:`SDPA_BUDGET`
    logits and at most :data:`MAX_ROWS` rows; past the budget the first entries are kept."""
    if first > 1 and first * rest * S > SDPA_BUDGET:
        first = max(1, SDPA_BUDGET // (rest * S))
    batch = first * rest
    want = min(SDPA_BUDGET // max(batch * S, 1), max(1, MAX_ROWS // max(batch, 1)))
    return first, 1 if want >= L else -(-L // max(want, 1))


def _attention_rows_host(q: torch.Tensor, k: torch.Tensor, is_causal: bool, scale: float | None) -> Vector | None:
    """The C path of :func:`attention_weights` for 4-d CPU ``q`` and ``k`` (batch dimensions that
    broadcast): read in place through their strides, no PyTorch operation (each costs microseconds
    while the model's forward keeps the caches busy). None when the C helper is not available."""
    (b0q, b1q, L, E), (b0k, b1k, S, _) = q.shape, k.shape
    nb0, nb1 = max(b0q, b0k), max(b1q, b1k)
    if q.dtype is not torch.float32 or k.dtype is not torch.float32:
        q, k = q.detach().float(), k.detach().float()
    qs, ks = list(q.stride()), list(k.stride())
    for i, (a, b) in enumerate(((b0q, b0k), (b1q, b1k))):
        qs[i] = 0 if a == 1 else qs[i]  # a broadcast dimension: the same entry for every index
        ks[i] = 0 if b == 1 else ks[i]
    nb0, step = _sample_rows(nb0, nb1, L, S)
    host = fused.attention_rows_cpu(q.data_ptr(), qs, k.data_ptr(), ks, nb0, nb1, -(-L // step), step, E, S,
                                    scale if scale is not None else 1 / math.sqrt(E), is_causal, ONEHOT_PROB)
    return [*host, 1.0] if host is not None else None


def _sdpa_call(args: tuple, kwargs: dict) -> Vector:
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
    bound = dict(zip(names, args))
    bound.update(kwargs)
    return attention_weights(bound["query"], bound["key"], bound.get("attn_mask"), bound.get("dropout_p", 0.0),
                             bool(bound.get("is_causal", False)), bound.get("scale"), bool(bound.get("enable_gqa", False)))


_MHA_NAMES = ("query", "key", "value", "embed_dim_to_check", "num_heads", "in_proj_weight", "in_proj_bias", "bias_k",
              "bias_v", "add_zero_attn", "dropout_p", "out_proj_weight", "out_proj_bias", "training", "key_padding_mask",
              "need_weights", "attn_mask", "use_separate_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight",
              "static_k", "static_v", "average_attn_weights", "is_causal")


def _mha_call(args: tuple, kwargs: dict) -> Vector:
    """The attention weights of ``F.multi_head_attention_forward`` (what ``nn.MultiheadAttention``
    calls; its softmax or fused kernel runs inside), recomputed from its query, key and projections."""
    b = dict(zip(_MHA_NAMES, args))
    b.update(kwargs)
    if b.get("bias_k") is not None or b.get("static_k") is not None or b.get("add_zero_attn"):
        raise Unobservable("bias_k, static_k or add_zero_attn")
    query, key, heads = b["query"], b["key"], int(b["num_heads"])
    if query.dim() != 3:
        raise Unobservable("unbatched inputs")
    embed = query.shape[-1]
    bias = b.get("in_proj_bias")
    if b.get("use_separate_proj_weight"):
        wq, wk = b["q_proj_weight"], b["k_proj_weight"]
    else:
        wq, wk = b["in_proj_weight"][:embed], b["in_proj_weight"][embed:2 * embed]
    bq, bk = (bias[:embed], bias[embed:2 * embed]) if bias is not None else (None, None)
    with torch.no_grad():
        L, N, S = query.shape[0], query.shape[1], key.shape[0]
        q = F.linear(query.detach(), wq.detach(), bq.detach() if bq is not None else None)
        k = F.linear(key.detach(), wk.detach(), bk.detach() if bk is not None else None)
        q = q.reshape(L, N, heads, -1).permute(1, 2, 0, 3)  # (N, heads, L, head_dim)
        k = k.reshape(S, N, heads, -1).permute(1, 2, 0, 3)
        mask = b.get("attn_mask")
        allowed: torch.Tensor | None = None
        if mask is not None:
            mask = mask.reshape(N, heads, L, S) if mask.dim() == 3 else mask
            allowed = ~mask if mask.dtype == torch.bool else mask.float()  # MHA: True means "masked out"
        padding = b.get("key_padding_mask")
        if padding is not None:
            keep = ~padding.bool() if padding.dtype == torch.bool else padding.float() != -math.inf
            keep = keep.reshape(N, 1, 1, S)
            if allowed is None or allowed.dtype == torch.bool:
                allowed = keep if allowed is None else allowed & keep
            else:
                allowed = allowed.masked_fill(~keep, -math.inf)
        causal = bool(b.get("is_causal")) and mask is None
        return attention_weights(q, k, allowed, is_causal=causal)


SDPA_SOURCE = "scaled_dot_product_attention"

# torch.nn classes whose forward calls no softmax and no attention: while one of them runs (an
# instance of exactly that class, its forward not replaced), the observer is off the mode stack and
# its operators do not pass through Python (a third of the operators of a small transformer).
QUIET_MODULES = frozenset(getattr(nn, n) for n in (
    "Linear", "Bilinear", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d",
    "Embedding", "EmbeddingBag", "LayerNorm", "GroupNorm", "RMSNorm", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d",
    "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d", "Dropout", "Dropout1d", "Dropout2d", "Dropout3d",
    "AlphaDropout", "Identity", "ReLU", "ReLU6", "GELU", "SiLU", "Mish", "Tanh", "Sigmoid", "Hardtanh", "Hardsigmoid",
    "Hardswish", "LeakyReLU", "PReLU", "ELU", "SELU", "CELU", "Softplus", "Softsign", "Flatten", "Unflatten",
    "MaxPool1d", "MaxPool2d", "MaxPool3d", "AvgPool1d", "AvgPool2d", "AvgPool3d", "AdaptiveAvgPool1d",
    "AdaptiveAvgPool2d", "AdaptiveAvgPool3d") if hasattr(nn, n))


def quiet(module: nn.Module) -> bool:
    """True for a module whose forward calls no softmax or attention (see :data:`QUIET_MODULES`)."""
    return type(module) in QUIET_MODULES and "forward" not in module.__dict__


class SoftmaxObserver(TorchFunctionMode):
    """Hands the softmax vector of every softmax, log_softmax and scaled_dot_product_attention call
    to ``record(source, vector)``; ``unobserved(reason)`` hears of calls it cannot describe."""

    def __init__(self, record: Record, unobserved: Callable[[str], None]):
        super().__init__()
        self.record = record
        self.unobserved = unobserved

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        kind = _SOFTMAX.get(func)
        try:
            if kind is not None and isinstance(out, torch.Tensor) and out.is_floating_point():
                self.record(kind, softmax_call(kind, args, kwargs, out))
            elif func in _SDPA:
                self.record(SDPA_SOURCE, _sdpa_call(args, kwargs))
            elif func in _MHA:
                self.record(SDPA_SOURCE, _mha_call(args, kwargs))
        except Unobservable as e:
            self.unobserved(f"the attention weights inside {getattr(func, '__name__', 'an attention call')} could not be "
                            f"observed ({e}): no softmax statistics for it")
        except Exception as e:  # noqa: BLE001 - statistics must never break the user's run
            self.unobserved(f"softmax statistics skipped ({type(e).__name__}: {e})")
        return out


def merge(a: list[float] | None, b: list[float]) -> list[float]:
    """Two host softmax vectors added (the calls of one module)."""
    return list(b) if a is None else [x + y for x, y in zip(a, b)]


def finalize(v: list[float]) -> dict[str, float | None]:
    """The per-step softmax statistics of a module from its host vector."""
    rows = v[0]
    return {
        "entropy": v[1] / rows if rows else None,
        "max_prob": v[2] / rows if rows else None,
        "onehot_frac": v[3] / rows if rows else None,
        "rows": rows,
        "calls": v[4],
    }


class ObserverSlot:
    """The softmax observer of one forward pass on this thread's torch-function mode stack: started
    when the first recorded module call begins, dropped when the outermost call returns. The hooks
    take it off the stack while they work (:meth:`suspend`, :meth:`resume`), so that their own torch
    calls do not pass through it."""

    def __init__(self, record: Record, unobserved: Callable[[str], None], enabled: bool = True):
        self.record, self.unobserved, self.enabled = record, unobserved, enabled
        self.observer: SoftmaxObserver | None = None

    def start(self) -> bool:
        """Create the observer of this forward pass; True when it is new (the caller pushes it)."""
        if self.enabled and self.observer is None:
            self.observer = SoftmaxObserver(self.record, self.unobserved)
            return True
        return False

    def suspend(self) -> bool:
        """Take the observer off the top of the stack; True when it was there."""
        obs = self.observer
        if obs is None:
            return False
        depth = torch._C._len_torch_function_stack()
        if depth and torch._C._get_function_stack_at(depth - 1) is obs:
            torch._C._pop_torch_function_stack()
            return True
        return False

    def resume(self) -> None:
        if self.observer is not None:
            torch._C._push_on_torch_function_stack(self.observer)

    def drop(self, suspended: bool) -> None:
        """Forget the observer (``suspended``: it is already off the stack; otherwise it is taken out
        from under any mode entered above it)."""
        observer, self.observer = self.observer, None
        if observer is None or suspended:
            return
        above = []
        while torch._C._len_torch_function_stack() > 0:
            top = torch._C._pop_torch_function_stack()
            if top is observer:
                break
            above.append(top)
        for mode in reversed(above):
            torch._C._push_on_torch_function_stack(mode)
