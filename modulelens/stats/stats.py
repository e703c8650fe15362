"""Statistics of one tensor, computed cheaply and mergeable across calls.

A tensor is reduced in float64 to a small *moment vector* (:data:`FIELDS`): element count, finite
count, mean, the centred power sums M2, M3, M4 of the finite values, zero, NaN and Inf counts, min,
max and (for bounded activations) a saturated count. On a GPU it stays on the device, so the vectors
of a whole step move to the host in one transfer (:func:`to_host`). Vectors of
several calls of one module merge exactly (:func:`merge`, Pébay's pairwise formulas), and
:func:`finalize` turns one into the statistics users read. Their definitions (:data:`DEFINITIONS`):

- ``mean``, ``std``: over the finite values; ``std`` is the population standard deviation
  (``numpy.std(ddof=0)``).
- ``skew``: ``scipy.stats.skew(bias=True)``, i.e. m3 / m2**1.5 with central moments m_k.
- ``kurtosis``: *excess* (Fisher) kurtosis, ``scipy.stats.kurtosis(fisher=True, bias=True)``:
  m4 / m2**2 - 3 (0 for a Gaussian).
- ``kl_gauss``: KL divergence from the Gaussian fit of the values to a unit Gaussian, in closed form:
  KL(N(mean, std^2) || N(0, 1)) = log(1/std) + (std^2 + mean^2 - 1) / 2, in nats. It measures how far
  the scale and offset are from N(0, 1); it does not see the shape (skew and kurtosis do).
- ``zero_frac``: fraction of all elements exactly equal to 0.
- ``min``, ``max``: over the finite values; ``nan``, ``inf``: counts of NaN and +-Inf elements.
- ``rms``: root mean square of the finite values, sqrt(mean^2 + std^2).
- ``sat_frac`` (tanh, sigmoid, hardtanh outputs): fraction of values within 1% of the half-range
  from either bound (tanh: |y| >= 0.99; sigmoid: y <= 0.005 or y >= 0.995).

Statistics that are undefined (std of a constant tensor, anything over zero finite values) are None.

Sampling (``sample``; the collector's default is :data:`DEFAULT_SAMPLE` = 65,536): for a tensor with
more elements than that, the moments (``mean``, ``std``, ``skew``, ``kurtosis`` and so ``kl_gauss``
and ``rms``) are estimated from a fixed strided view of about ``sample`` of its elements (every s-th
element, s coprime with the last dimension so every column is covered; no copy of the tensor).
``count``, ``zero_frac``, ``min``, ``max``, ``nan``, ``inf`` and ``sat_frac`` always cover every
element. ``sample=None`` or ``0`` computes everything exactly. Heavy tails: when the sample's excess
kurtosis exceeds :data:`HEAVY_TAIL_KURTOSIS`, the moments are recomputed exactly over every element
(streamed in chunks), since a sample misses the rare extremes that dominate skewness and kurtosis.
Tensors holding NaN/Inf, and every tensor on a GPU (where the counts already read every element),
get exact moments. Contiguous float32/float64/bfloat16 CPU tensors are always read whole, in one pass
by the C helper (:mod:`modulelens.stats.fused`), so their moments are exact whatever ``sample`` says;
the sample applies to the other CPU tensors (non-contiguous, other dtypes, or without the C helper).
``sampled`` (True/False) says whether a statistic's moments came from a sample.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from modulelens.stats.fused import moments_cpu, sum_squares_cpu

# Layout of a moment vector.
FIELDS = ("numel", "count", "mean", "m2", "m3", "m4", "zeros", "nan", "inf", "min", "max", "sat", "sampled")
_I = {f: i for i, f in enumerate(FIELDS)}
NAN, INF, SAMPLED = _I["nan"], _I["inf"], _I["sampled"]
COUNT, MAX = _I["count"], _I["max"]

STAT_NAMES = (
    "count", "mean", "std", "skew", "kurtosis", "zero_frac", "min", "max", "nan", "inf", "kl_gauss", "rms",
)

DEFINITIONS: dict[str, str] = {
    "count": "number of finite elements",
    "mean": "mean of the finite elements",
    "std": "population standard deviation of the finite elements (numpy.std, ddof=0)",
    "skew": "skewness m3/m2^1.5 of the finite elements (scipy.stats.skew, bias=True)",
    "kurtosis": "excess (Fisher) kurtosis m4/m2^2 - 3 of the finite elements "
    "(scipy.stats.kurtosis, fisher=True, bias=True); 0 for a Gaussian",
    "zero_frac": "fraction of all elements exactly equal to zero",
    "min": "smallest finite element",
    "max": "largest finite element",
    "nan": "number of NaN elements",
    "inf": "number of +Inf or -Inf elements",
    "kl_gauss": "KL(N(mean, std^2) || N(0, 1)) = log(1/std) + (std^2 + mean^2 - 1)/2 in nats: the KL divergence "
    "from the Gaussian fit of the finite elements to a unit Gaussian (closed form, no histogram)",
    "rms": "root mean square of the finite elements, sqrt(mean^2 + std^2)",
    "sat_frac": "tanh/sigmoid/hardtanh outputs only: fraction of elements within 1% of the half-range from "
    "either bound (tanh |y| >= 0.99, sigmoid y <= 0.005 or >= 0.995)",
    "gain": "output rms / input rms of the module call (activations only)",
    "input_rms": "root mean square of the module's floating inputs",
    "input_max": "largest element of the module's floating inputs, when each of them was the output of a module "
    "called earlier in the step (None otherwise)",
    "update_ratio": "parameters only: ||w_after - w_before|| / ||w_before|| across the sampled optimizer step "
    "(exact up to 65,536 elements; larger parameters: on every s-th slice along the first dimension, about 65,536 "
    "elements, so every column is covered; parameters whose slices hold more than 262,144 elements or that are not "
    "contiguous: on every s-th element, s coprime with the last dimension)",
    "grad_to_weight": "parameters only: ||grad|| / ||w|| before the optimizer step",
    "dead_rows": "weights of two or more dimensions only: the fraction of their rows (output units) whose gradient was "
    "exactly zero on this sampled step and on the previous one (every s-th row above 65,536 elements)",
    "entropy": "softmax only: mean over rows of the entropy divided by log(number of unmasked entries): 1 uniform, "
    "0 one-hot (rows with fewer than two unmasked entries left out; attention weights of "
    "scaled_dot_product_attention recomputed from q and k, before dropout, for a sample of query rows)",
    "max_prob": "softmax only: mean over rows of the largest probability",
    "onehot_frac": "softmax only: the fraction of rows whose largest probability is at least 0.99",
    "weight_rms": "parameters only: ||w|| / sqrt(numel)",
    "grad_rms": "parameters only: ||grad|| / sqrt(numel)",
    "sampling": "mean, std, skew, kurtosis, kl_gauss and rms of a tensor with more elements than the sample size "
    "(the series' 'sample'; default 65,536; None: exact) are estimated from a fixed strided view of about that many "
    "elements (every s-th element, s coprime with the last dimension); count, zero_frac, min, max, nan, inf and "
    "sat_frac always cover every element; when the sample's excess kurtosis is above 6 (heavy tails) they are "
    "recomputed exactly over every element, as are those of tensors holding NaN/Inf and of every tensor on a GPU; "
    "contiguous float32/float64/bfloat16 CPU tensors are always read whole (exact moments, sampled False)",
    "sampled": "True when mean, std, skew, kurtosis, kl_gauss and rms were estimated from a sample (see 'sampling'); "
    "False when exact",
}

# Saturating activations: (centre, half-range) of their output.
SATURATING: dict[str, tuple[float, float]] = {
    "Tanh": (0.0, 1.0),
    "Sigmoid": (0.5, 0.5),
    "Hardtanh": (0.0, 1.0),
    "Hardsigmoid": (0.5, 0.5),
    "Softsign": (0.0, 1.0),
}
SAT_FRACTION = 0.99

# Above this excess kurtosis of the sample, the CPU path recomputes the moments over every element:
# the rare extremes of a heavy-tailed tensor dominate m3 and m4 and a sample misses them (a Student-t
# with 3 degrees of freedom: sampled kurtosis 148 against 691 over 10M elements).
HEAVY_TAIL_KURTOSIS = 6.0

# Default sample size for the moments of large tensors (see the module docstring). With it, the
# standard error of std on a Gaussian tensor is about 0.3%, of the excess kurtosis about 0.02.
DEFAULT_SAMPLE = 1 << 16

# Devices where reading a value back to the host costs nothing (no asynchronous queue to stall):
# there, statistics take the fast path that checks for NaN/Inf first and returns host floats.
# Elsewhere (GPUs) everything stays on the device until the step ends.
HOST_PATH_DEVICES = {"cpu"}


def moments(t: torch.Tensor, saturation: tuple[float, float] | None = None,
            sample: int | None = None) -> torch.Tensor | list[float]:
    """The moment vector of ``t``: on a GPU a float64 tensor on that device (no host
    synchronisation: the vectors of a step move together in :func:`to_host`); on the CPU a list of
    floats straight away (a host sync is free there, and it saves a dozen small tensor operations).

    ``saturation`` = (centre, half-range) also counts elements within 1% of the half-range from
    either bound. ``sample``: for tensors with more elements, mean, std, skewness, kurtosis (and so
    KL) are estimated from a fixed strided sample of about that many elements (:func:`strided`);
    the counts (zeros, NaN, Inf, saturated) and min/max always cover every element.
    """
    if t.is_cpu and "cpu" in HOST_PATH_DEVICES:  # contiguous float32/float64/bfloat16: one pass in C
        fused = moments_cpu(t, saturation, SAT_FRACTION)
        if fused is not None:
            return fused
    x = t.detach()
    if x.is_complex():
        x = torch.view_as_real(x)
    if not x.is_floating_point():
        x = x.to(torch.float64)
    flat = x.reshape(-1)
    n = flat.numel()
    if n == 0:
        return [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, math.inf, -math.inf, 0.0, 0.0]
    if flat.device.type in HOST_PATH_DEVICES:
        fused = moments_cpu(flat, saturation, SAT_FRACTION)
        if fused is not None:
            return fused
        mn, mx = torch.aminmax(flat)
        mn, mx = float(mn), float(mx)
        # NaN propagates through min/max and Inf shows in them: a cheap all-finite test.
        if math.isfinite(mn) and math.isfinite(mx):
            src = strided(flat, sample, x.shape[-1] if x.dim() else 1) if sample and n > sample else flat
            return _finite_moments_cpu(flat, src, n, mn, mx, saturation)
        return _masked_moments(flat, n, saturation).tolist()
    return _masked_moments(flat, n, saturation)


def strided_step(n: int, k: int, cols: int = 1) -> int:
    """The step of :func:`strided` for ``n`` elements: about ``n / k``, coprime with ``cols``."""
    stride = max(1, n // k)
    while math.gcd(stride, max(cols, 1)) != 1:
        stride += 1
    return stride


def strided(flat: torch.Tensor, k: int, cols: int = 1) -> torch.Tensor:
    """A view of about ``k`` evenly spaced elements of a flat tensor. The stride is made coprime
    with ``cols`` (the last dimension) so the sample covers every column, not a few of them."""
    n = flat.numel()
    if n <= k:
        return flat
    return flat[::strided_step(n, k, cols)]


def _saturated(flat: torch.Tensor, saturation: tuple[float, float]) -> torch.Tensor:
    centre, half = saturation
    # In float32 at least: 0.99 rounds to 0.988 in bfloat16, which would count unsaturated values.
    x = flat if flat.dtype in (torch.float32, torch.float64) else flat.float()
    return ((x - centre).abs() >= SAT_FRACTION * half).sum()


def _finite_moments_cpu(flat: torch.Tensor, src: torch.Tensor, n: int, mn: float, mx: float,
                        saturation: tuple[float, float] | None) -> list[float]:
    k = src.numel()
    rows = _scratch(max(k, n))
    if mn > 0 or mx < 0:
        zeros = 0
    else:
        # sum(|sign(x)|): several times faster than count_nonzero on the CPU. Written into the work
        # area (viewed in the tensor's dtype); summed exactly (float32 holds counts below 2**24).
        signs = torch.sign(flat, out=rows.view(-1).view(flat.dtype)[:n])
        if mn < 0:  # all >= 0 (ReLU outputs): the signs are already 0 or 1
            signs.abs_()
        acc = torch.float32 if n < 2**24 else torch.float64
        zeros = n - int(signs.sum() if signs.dtype == acc else signs.sum(dtype=acc))
    sat = float(_saturated(flat, saturation)) if saturation is not None else 0.0
    # Rows: centred values d and their squares; one small matrix product gives
    # sum(d*d), sum(d*d^2) and sum(d^2*d^2) in a single pass over both rows.
    rows = rows.view(-1)[: 2 * k].view(2, k)
    d = rows[0]
    d.copy_(src)
    mean = float(d.sum()) / k
    d.sub_(mean)
    torch.mul(d, d, out=rows[1])
    (m2, m3), (_, m4) = (rows @ rows.T).tolist()
    sampled = k < n
    if sampled and m2 > 0 and (m4 / k) / (m2 / k) ** 2 - 3.0 > HEAVY_TAIL_KURTOSIS:
        # Heavy tails: a sample misses the rare extremes that dominate m3 and m4; redo them exactly.
        mean, m2, m3, m4 = _exact_central_sums(flat, mean)
        sampled = False
    elif sampled:
        scale = n / k  # central sums of the sample, as for n elements
        m2, m3, m4 = m2 * scale, m3 * scale, m4 * scale
    return [float(n), float(n), mean, m2, m3, m4, float(zeros), 0.0, 0.0, mn, mx, sat, float(sampled)]


def _exact_central_sums(flat: torch.Tensor, shift: float) -> tuple[float, float, float, float]:
    """Mean and central power sums M2, M3, M4 of all elements of a finite flat tensor, streamed in
    float64 chunks around ``shift`` (the sample mean: close to the mean, so no cancellation)."""
    n = flat.numel()
    chunk = 1 << 20
    rows = _scratch(min(n, chunk))
    s1 = s2 = s3 = s4 = 0.0
    for start in range(0, n, chunk):
        part = flat[start:start + chunk]
        k = part.numel()
        view = rows.view(-1)[: 2 * k].view(2, k)
        d = view[0]
        d.copy_(part)
        d.sub_(shift)
        torch.mul(d, d, out=view[1])
        (a2, a3), (_, a4) = (view @ view.T).tolist()
        s1 += float(d.sum())
        s2, s3, s4 = s2 + a2, s3 + a3, s4 + a4
    mu = s1 / n
    m2 = s2 - n * mu * mu
    m3 = s3 - 3 * mu * s2 + 2 * n * mu**3
    m4 = s4 - 4 * mu * s3 + 6 * mu * mu * s2 - 3 * n * mu**4
    return shift + mu, m2, m3, m4


_local = threading.local()


def _scratch(k: int) -> torch.Tensor:
    """A (2, k) float64 work area reused across calls (per thread): fresh multi-megabyte
    allocations for every tensor cost page faults and cache misses."""
    buf = getattr(_local, "buf", None)
    if buf is None or buf.numel() < 2 * k:
        buf = _local.buf = torch.empty(2 * max(k, 1 << 16), dtype=torch.float64)
    return buf[: 2 * k].view(2, k)


def release_scratch() -> None:
    """Free this thread's work area (the collector calls it when a sampled step ends)."""
    _local.buf = None


def _central(d: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Count, mean and central power sums of the finite elements of a float64 tensor."""
    fin = torch.isfinite(d)
    cnt = fin.sum().to(torch.float64)
    mean = torch.where(fin, d, 0.0).sum() / cnt.clamp(min=1.0)
    c = torch.where(fin, d - mean, 0.0)
    c2 = c * c
    return cnt, mean, c2.sum(), (c2 * c).sum(), (c2 * c2).sum()


def _masked_moments(flat: torch.Tensor, n: int, saturation: tuple[float, float] | None) -> torch.Tensor:
    d = flat.to(torch.float64)
    zeros = (n - torch.count_nonzero(flat)).to(torch.float64)
    if saturation is not None:
        sat = _saturated(flat, saturation).to(torch.float64)
    else:
        sat = torch.zeros((), dtype=torch.float64, device=d.device)
    fin = torch.isfinite(d)
    cnt = fin.sum().to(torch.float64)
    nan = torch.isnan(d).sum().to(torch.float64)
    inf = n - cnt - nan
    mn = torch.where(fin, d, math.inf).min()
    mx = torch.where(fin, d, -math.inf).max()
    # Exact moments over every element: on a GPU a full pass costs little more than the counts
    # above, and a sample would need a host sync to check its tails. On the CPU this path only
    # runs for tensors holding NaN/Inf.
    _, mean, m2, m3, m4 = _central(d)
    nn_ = torch.full((), float(n), dtype=torch.float64, device=d.device)
    return torch.stack([nn_, cnt, mean, m2, m3, m4, zeros, nan, inf, mn, mx, sat, torch.zeros_like(sat)])


def to_host(vectors: Sequence[torch.Tensor | list[float]]) -> list[list[float]]:
    """Host lists of many moment vectors: device tensors move in one transfer per device."""
    out: list[list[float]] = [v if isinstance(v, list) else [] for v in vectors]
    by_device: dict[torch.device, list[int]] = {}
    for i, v in enumerate(vectors):
        if not isinstance(v, list):
            by_device.setdefault(v.device, []).append(i)
    for idx in by_device.values():
        rows = torch.stack([vectors[i] for i in idx]).cpu().tolist()  # type: ignore[misc]
        for i, row in zip(idx, rows):
            out[i] = row
    return out


def merge(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """Combine two host moment vectors as if their elements had been reduced together."""
    na, nb = a[1], b[1]
    out = list(a)
    out[0] = a[0] + b[0]
    for f in ("zeros", "nan", "inf", "sat"):
        out[_I[f]] = a[_I[f]] + b[_I[f]]
    out[_I["sampled"]] = max(a[_I["sampled"]], b[_I["sampled"]])
    out[_I["min"]] = min(a[_I["min"]], b[_I["min"]])
    out[_I["max"]] = max(a[_I["max"]], b[_I["max"]])
    if nb == 0:
        return out
    if na == 0:
        for f in ("count", "mean", "m2", "m3", "m4"):
            out[_I[f]] = b[_I[f]]
        return out
    n = na + nb
    delta = b[2] - a[2]
    ma2, ma3, ma4 = a[3], a[4], a[5]
    mb2, mb3, mb4 = b[3], b[4], b[5]
    out[1] = n
    out[2] = a[2] + delta * nb / n
    out[3] = ma2 + mb2 + delta**2 * na * nb / n
    out[4] = ma3 + mb3 + delta**3 * na * nb * (na - nb) / n**2 + 3 * delta * (na * mb2 - nb * ma2) / n
    out[5] = (
        ma4 + mb4
        + delta**4 * na * nb * (na * na - na * nb + nb * nb) / n**3
        + 6 * delta**2 * (na * na * mb2 + nb * nb * ma2) / n**2
        + 4 * delta * (na * mb3 - nb * ma3) / n
    )
    return out


def merge_all(vectors: Iterable[Sequence[float]]) -> list[float] | None:
    acc: list[float] | None = None
    for v in vectors:
        acc = list(v) if acc is None else merge(acc, v)
    return acc


def _num(x: float) -> float | None:
    return x if math.isfinite(x) else None


def finalize(v: Sequence[float], saturation: bool = False) -> dict[str, Any]:
    """The user-facing statistics of a host moment vector (see the module docstring)."""
    numel, count, mean = v[0], v[1], v[2]
    out: dict[str, Any] = {s: None for s in STAT_NAMES}
    out.update(count=int(count), nan=int(v[_I["nan"]]), inf=int(v[_I["inf"]]), sampled=bool(v[_I["sampled"]]))
    out["zero_frac"] = v[_I["zeros"]] / numel if numel else None
    if saturation:
        out["sat_frac"] = v[_I["sat"]] / numel if numel else None
    if count == 0:
        return out
    var = max(v[3] / count, 0.0)
    std = math.sqrt(var)
    out.update(mean=_num(mean), std=_num(std), min=_num(v[_I["min"]]), max=_num(v[_I["max"]]))
    out["rms"] = _num(math.sqrt(var + mean * mean))
    # A constant tensor (up to rounding) has no defined shape statistics.
    if var > 1e-13 * max(mean * mean, 1e-290):
        out["skew"] = _num((v[4] / count) / var**1.5)
        out["kurtosis"] = _num((v[5] / count) / (var * var) - 3.0)
        out["kl_gauss"] = _num(-math.log(std) + 0.5 * (var + mean * mean - 1.0))
    return out


def tensor_stats(t: torch.Tensor, saturation: tuple[float, float] | None = None,
                 sample: int | None = None) -> dict[str, Any]:
    """All statistics of one tensor (convenience wrapper: one moment vector, finalized)."""
    try:
        return finalize(to_host([moments(t, saturation, sample)])[0], saturation is not None)
    finally:
        release_scratch()


def l2_from_moments(v: Sequence[float]) -> float:
    """The Euclidean norm of the tensor a host moment vector describes (inf when it held NaN/Inf),
    without another pass over it: sqrt(M2 + count * mean^2)."""
    if v[_I["nan"]] + v[_I["inf"]] > 0:
        return math.inf
    return math.sqrt(max(v[_I["m2"]] + v[_I["count"]] * v[_I["mean"]] ** 2, 0.0))


def l2(t: torch.Tensor) -> torch.Tensor | float:
    """Euclidean norm (inf or NaN when the tensor holds Inf/NaN). On the CPU a float, computed in
    the tensor's precision and redone in float64 only when that overflowed; on a GPU a float64
    scalar tensor on the device (no synchronisation)."""
    if t.is_cpu and "cpu" in HOST_PATH_DEVICES:
        sq = sum_squares_cpu(t)  # in double: exact, and no overflow for float32/bfloat16
        if sq is not None:
            return math.sqrt(sq)
    x = t.detach()
    if not x.is_floating_point():
        x = x.to(torch.float64)
    if x.device.type in HOST_PATH_DEVICES:
        v = float(torch.linalg.vector_norm(x))
        if math.isfinite(v) or x.dtype == torch.float64:
            return v
        return float(torch.linalg.vector_norm(x, dtype=torch.float64))
    return torch.linalg.vector_norm(x, dtype=torch.float64)
