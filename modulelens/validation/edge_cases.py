"""The operator's own edge cases, run in every card validation beside the captured and fresh inputs.

Random and captured inputs almost never reach what defines an operator's semantics, so each card
also gets, within its captured shapes (always admitted):

- structural cases per operator family: softmax-like operators (``_softmax``, ``_safe_softmax``,
  ``_log_softmax``) get fully masked rows (the captured sample's partly ``-inf`` rows extended to whole
  rows, else the first and last rows), a column masked in every row, and inputs shifted past ``exp``
  overflow and underflow; norms (layer, RMS, group) get constant rows (variance 0, where eps decides);
  activations built on ``exp`` (GELU, SiLU, sigmoid, tanh, ...) get values around ``exp`` overflow;
- for every operator with a floating input: NaN and +-inf at random positions, and -0 with denormals;
- PyTorch's OpInfo samples for the operator (``op_db``: ``reference_inputs``, else ``sample_inputs``)
  when an entry exists and ``expecttest`` (which the OpInfo module needs) is installed: at most
  :data:`OPINFO_LIMIT` samples of the card's dtype, their values transplanted into the card's first
  floating input (repeated to its shape); the values are kept in a cache folder in the build folder
  (:func:`opinfo_cache_dir`), filled by a subprocess the caller starts outside the sandbox
  (:func:`ensure_opinfo_values`), so only the first validation of an operator pays for importing
  ``op_db`` and the checker only reads.

Each case says what it is and where it came from (:class:`EdgeCase`), and its label names the
positions it set ("row 3 of input 0 is all -inf"), so a failure on it reads as one line an agent
can act on. Only the first floating tensor argument is changed; the others stay as captured.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from modulelens.validation.compare import position_text

SOFTMAX_OPS = frozenset({"_softmax", "_safe_softmax", "_log_softmax", "softmax", "log_softmax"})
NORM_OPS = {"native_layer_norm": "layer", "layer_norm": "layer", "_fused_rms_norm": "layer", "rms_norm": "layer",
            "native_group_norm": "group", "group_norm": "group"}
EXP_POINTWISE = frozenset({"gelu", "silu", "sigmoid", "tanh", "exp", "expm1", "softplus", "elu", "mish",
                           "log_sigmoid_forward", "hardswish", "selu", "celu"})
OPINFO_LIMIT = 2
"""At most this many OpInfo samples per card."""
NAN_SOURCE = "structural: NaN and infinities"
OPINFO_NAMES = {"_softmax": "softmax", "_safe_softmax": "softmax", "_log_softmax": "log_softmax",
                "native_layer_norm": "nn.functional.layer_norm", "_fused_rms_norm": "nn.functional.rms_norm",
                "native_group_norm": "nn.functional.group_norm",
                "_adaptive_avg_pool2d": "nn.functional.adaptive_avg_pool2d"}


@dataclass
class EdgeCase:
    """One edge case: ``label`` says what it is, naming the positions it set; ``source`` where it
    came from (``structural: <kind>`` or ``OpInfo <name> <suite> sample <k>``); the call's arguments."""

    label: str
    source: str
    args: list
    kwargs: dict


def op_base_name(op_name: str) -> str:
    """``aten._softmax.default`` -> ``_softmax``."""
    parts = op_name.removeprefix("aten.").split(".")
    return parts[0]


def _first_floating(args: list) -> int | None:
    return next((i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.is_floating_point()
                 and a.numel() > 0), None)


def tensor_like(t: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``values`` (``t``'s shape) in a tensor with ``t``'s shape, strides, dtype and device (contiguous
    where ``t`` is broadcast, a stride 0 over several elements, which cannot hold other values)."""
    broadcast = any(st == 0 and n > 1 for st, n in zip(t.stride(), t.shape))
    out = (torch.empty(t.shape, dtype=t.dtype, device=t.device) if broadcast
           else torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device))
    out.copy_(values.to(t.dtype))
    return out


def _with(args: list, i: int, values: torch.Tensor) -> list:
    return [tensor_like(a, values) if j == i else a for j, a in enumerate(args)]


def rows_of(x: torch.Tensor, dim: int) -> torch.Tensor:
    """``x`` (float64 copy) with ``dim`` moved last, as [rows, length]."""
    return x.detach().double().movedim(dim, -1).reshape(-1, x.shape[dim]).clone()


def unrows(rows: torch.Tensor, x: torch.Tensor, dim: int) -> torch.Tensor:
    """:func:`rows_of` undone: ``rows`` back in ``x``'s shape."""
    moved = list(x.movedim(dim, -1).shape)
    return rows.reshape(moved).movedim(-1, dim)


def _row_name(r: int, x: torch.Tensor, dim: int) -> str:
    outer = [s for d, s in enumerate(x.shape) if d != dim % x.dim()]
    if len(outer) <= 1:
        return f"row {r}"
    idx = []
    for s in reversed(outer):
        idx.append(r % s)
        r //= s
    return f"row ({', '.join(map(str, reversed(idx)))})"


def rows_text(rows: list[int], x: torch.Tensor, dim: int) -> str:
    """Rows ``rows`` of :func:`rows_of` named by their index: ``row 3`` or ``row (0, 2) and row (1, 2)``."""
    names = [_row_name(r, x, dim) for r in rows]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _dim(args: list, kwargs: dict) -> int:
    d = args[1] if len(args) > 1 and isinstance(args[1], int) and not isinstance(args[1], bool) else kwargs.get("dim", -1)
    return int(d)


def _exp_edge(dtype: torch.dtype) -> float:
    """log of the dtype's largest value: exp overflows past it."""
    return math.log(torch.finfo(dtype).max)


def _softmax_cases(args: list, kwargs: dict, i: int) -> list[EdgeCase]:
    x = args[i]
    dim = _dim(args, kwargs)
    if x.dim() == 0 or x.shape[dim] == 0:
        return []
    rows = rows_of(x, dim)
    n = rows.shape[0]
    partly = torch.isneginf(rows).any(1) & ~torch.isneginf(rows).all(1)
    captured = [int(r) for r in torch.nonzero(partly).flatten()[:2]]
    chosen = captured or sorted({0, n - 1})
    masked = rows.clone()
    masked[chosen] = -math.inf
    where = rows_text(chosen, x, dim)
    verb = "is" if len(chosen) == 1 else "are"
    how = "partly masked in the capture, extended to whole rows" if captured else "whole rows masked"
    out = [EdgeCase(f"{where} of input {i} {verb} all -inf ({how}, along dim {dim})", "structural: fully masked rows",
                    _with(args, i, unrows(masked, x, dim)), kwargs)]
    if rows.shape[1] > 1:
        col = rows.clone()
        col[:, 0] = -math.inf
        out.append(EdgeCase(f"position 0 along dim {dim} of every row of input {i} is -inf (a masked column)",
                            "structural: masked column", _with(args, i, unrows(col, x, dim)), kwargs))
    edge = _exp_edge(x.dtype)
    shift = round(1.1 * edge + 10, 1)  # past overflow, and past underflow to 0 (denormals included)
    for sign, what in ((1, "overflow"), (-1, "underflow")):
        out.append(EdgeCase(f"input {i} shifted by {sign * shift:+g} (exp {what}s beyond {sign * edge:+.1f}; "
                            "the result is the same as unshifted)", f"structural: exp {what}",
                            _with(args, i, x.detach().double() + sign * shift), kwargs))
    return out


def _norm_cases(name: str, args: list, kwargs: dict, i: int) -> list[EdgeCase]:
    x = args[i]
    if i != 0 or x.dim() == 0:
        return []
    if NORM_OPS[name] == "group":
        k = x.dim() - 1
    else:
        shape = args[1] if len(args) > 1 else kwargs.get("normalized_shape", [x.shape[-1]])
        k = len(shape)
    inner = math.prod(x.shape[x.dim() - k:]) if k else 1
    if inner <= 1 or x.numel() == 0:
        return []
    n = x.numel() // inner
    constants = torch.tensor([3.0, -2.0, 0.0, 0.5], dtype=torch.float64)
    rows = constants[torch.arange(n) % 4].unsqueeze(1).expand(n, inner)
    what = "sample" if NORM_OPS[name] == "group" else "row"
    return [EdgeCase(f"every {what} of input 0 is constant (3, -2, 0, 0.5 in turn; variance 0, where eps decides)",
                     "structural: constant rows", _with(args, i, rows.reshape(x.shape)), kwargs)]


def _exp_pointwise_cases(args: list, kwargs: dict, i: int) -> list[EdgeCase]:
    x = args[i]
    m = _exp_edge(x.dtype)
    big = min(1e4, torch.finfo(x.dtype).max / 4)
    base = torch.tensor([m - 1, m, m + 1, 2 * m, big, -(m - 1), -m, -(m + 1), -2 * m, -big], dtype=torch.float64)
    values = base.repeat(x.numel() // base.numel() + 1)[:x.numel()].reshape(x.shape)
    return [EdgeCase(f"input {i} holds +-{m - 1:.1f}, +-{m:.1f}, +-{m + 1:.1f}, +-{2 * m:.1f}, +-{big:g} in turn "
                     "(around exp overflow)", "structural: near exp overflow", _with(args, i, values), kwargs)]




def special_value_cases(args: list, kwargs: dict, i: int, seed: int) -> list[EdgeCase]:
    """Argument ``i`` (floating) with NaN and +-inf at random positions (when it has 3 elements or
    more), and with -0 and denormals; the other arguments as they are."""
    x = args[i]
    g = torch.Generator().manual_seed(seed)
    n = x.numel()
    out = []
    values = x.detach().double().reshape(-1).clone()
    values = torch.where(torch.isfinite(values), values, torch.randn(n, generator=g, dtype=torch.float64))
    picks = torch.randperm(n, generator=g)
    k = max(1, n // 32)
    if n >= 3:
        nan, pinf, ninf = picks[:k], picks[k:2 * k], picks[2 * k:3 * k]
        values[nan], values[pinf], values[ninf] = math.nan, math.inf, -math.inf
        label = (f"input {i} has NaN at {position_text(int(nan[0]), x.shape)}, +inf at {position_text(int(pinf[0]), x.shape)}, "
                 f"-inf at {position_text(int(ninf[0]), x.shape)} ({k} of each, random positions)")
        out.append(EdgeCase(label, NAN_SOURCE, _with(args, i, values.reshape(x.shape)), kwargs))
    tiny = torch.finfo(x.dtype).smallest_normal / 8
    special = x.detach().double().reshape(-1).clone()
    special = torch.where(torch.isfinite(special), special, torch.zeros(()))
    zeros, denormals = picks[: n // 3 or 1], picks[n // 3: 2 * n // 3]
    special[zeros] = -0.0
    special[denormals] = tiny * torch.where(torch.rand(denormals.numel(), generator=g) < 0.5, -1.0, 1.0).double()
    out.append(EdgeCase(f"input {i} has -0 at a third of its positions and denormals (+-{tiny:.3g}) at another third",
                        "structural: -0 and denormals", _with(args, i, special.reshape(x.shape)), kwargs))
    return out


def structural_cases(op_name: str, args: list, kwargs: dict, seed: int = 0) -> list[EdgeCase]:
    """The structural edge cases for a call of ``op_name`` on ``args``/``kwargs`` (see the module
    docstring); [] when it has no floating tensor argument."""
    i = _first_floating(args)
    if i is None:
        return []
    name = op_base_name(op_name)
    out: list[EdgeCase] = []
    if name in SOFTMAX_OPS:
        out += _softmax_cases(args, kwargs, i)
    if name in NORM_OPS:
        out += _norm_cases(name, args, kwargs, i)
    if name in EXP_POINTWISE:
        out += _exp_pointwise_cases(args, kwargs, i)
    return out + special_value_cases(args, kwargs, i, seed)


# -- OpInfo --------------------------------------------------------------------------------------

OPINFO_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
OPINFO_FILL_TIMEOUT_S = 180.0


def opinfo_cache_dir() -> Path:
    """Where OpInfo values are kept (created if missing): ``opinfo`` in the build folder; a card's
    checker may read it (the caller names it readable) but not write it: :func:`ensure_opinfo_values`
    fills it from outside the sandbox."""
    from modulelens.kernels import default_build_dir

    folder = default_build_dir() / "opinfo"
    folder.mkdir(exist_ok=True)
    return folder


def _cache_file(name: str) -> Path:
    return opinfo_cache_dir() / f"{name}-{OPINFO_LIMIT}.pt"


def _op_db() -> list | None:
    """torch's OpInfo database, or None when it cannot be imported (expecttest missing, or a torch
    without its test internals)."""
    try:
        from torch.testing._internal.common_methods_invocations import op_db
    except Exception:  # noqa: BLE001
        return None
    return op_db


def _opinfo_entry(op_db: list, name: str):
    """The OpInfo entry of ``op_db`` for aten base name ``name``, or None."""
    wanted = [OPINFO_NAMES.get(name, name), name.lstrip("_"), f"nn.functional.{name.lstrip('_')}"]
    for w in wanted:
        for entry in op_db:
            if entry.name == w and not entry.variant_test_name:
                return entry
    return None


def _opinfo_samples(entry, dtype: torch.dtype, limit: int) -> list[tuple[str, torch.Tensor]]:
    """(source, float64 flat values of the sample's input) for up to ``limit`` samples of ``entry``."""
    out: list[tuple[str, torch.Tensor]] = []
    for suite in ("reference_inputs", "sample_inputs"):
        try:
            samples = list(getattr(entry, suite)("cpu", dtype))
        except Exception:  # noqa: BLE001 - a dtype the entry does not support
            continue
        found = [(k, s.input) for k, s in enumerate(samples) if isinstance(s.input, torch.Tensor)
                 and s.input.is_floating_point() and s.input.numel() > 1]
        # samples holding non-finite or extreme values first: they are the ones random draws miss
        found.sort(key=lambda ks: -int(bool((~torch.isfinite(ks[1])).any()) or bool((ks[1].abs() > 1e3).any())))
        for k, t in found[:limit - len(out)]:
            out.append((f"OpInfo {entry.name} {suite} sample {k} (shape {list(t.shape)})",
                        t.detach().double().reshape(-1).clone()))
        if len(out) >= limit:
            break
    return out


def fill_opinfo_cache(name: str) -> None:
    """Write the OpInfo values of aten base name ``name`` for :data:`OPINFO_DTYPES` into the cache
    (an empty table when op_db has no entry: kept too, so that nobody asks again). Where op_db
    cannot be imported nothing is written, so a later validation, after ``pip install expecttest``,
    asks again instead of finding the operator without samples for good."""
    op_db = _op_db()
    if op_db is None:
        return
    entry = _opinfo_entry(op_db, name)
    table = {str(d): _opinfo_samples(entry, d, OPINFO_LIMIT) if entry is not None else [] for d in OPINFO_DTYPES}
    path = _cache_file(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    torch.save(table, tmp)
    os.replace(tmp, path)


def ensure_opinfo_values(op_name: str) -> None:
    """Fill the OpInfo cache for ``op_name`` unless it is there, in a subprocess (importing op_db
    takes seconds and changes global state, so it stays out of this process). Called outside the
    sandbox, before a card validation; a failure only leaves the card without OpInfo cases."""
    import subprocess
    import sys

    name = op_base_name(op_name)
    if _cache_file(name).is_file():
        return
    try:
        subprocess.run([sys.executable, "-m", "modulelens.validation.edge_cases", name], capture_output=True,
                       timeout=OPINFO_FILL_TIMEOUT_S, check=False, env={**os.environ, "OMP_NUM_THREADS": "1"})
    except (OSError, subprocess.SubprocessError):
        pass


def opinfo_values(name: str, dtype: torch.dtype) -> list[tuple[str, torch.Tensor]]:
    """The cached OpInfo values of aten base name ``name`` for ``dtype`` ([] when none are cached)."""
    path = _cache_file(name)
    try:
        table = torch.load(path, weights_only=True)
    except Exception:  # noqa: BLE001 - not cached (or unreadable): no OpInfo cases
        return []
    return [(s, t) for s, t in table.get(str(dtype), [])]


def opinfo_cases(op_name: str, args: list, kwargs: dict, limit: int = OPINFO_LIMIT) -> list[EdgeCase]:
    """OpInfo samples of ``op_name`` with their values transplanted into the first floating input
    (repeated to its shape, cast to its dtype)."""
    i = _first_floating(args)
    if i is None:
        return []
    x = args[i]
    out = []
    for source, flat in opinfo_values(op_base_name(op_name), x.dtype)[:limit]:
        values = flat.repeat(x.numel() // flat.numel() + 1)[:x.numel()].reshape(x.shape)
        out.append(EdgeCase(f"input {i} holds the values of {source}, repeated to its shape", source, _with(args, i, values), kwargs))
    return out


INTERPRETER_LIMIT = 3
"""At most this many edge cases for a Triton kernel under the interpreter (``TRITON_INTERPRET=1``,
no GPU), where each call takes seconds: see :func:`capped_for_interpreter`."""


def capped_for_interpreter(cases: list[EdgeCase], limit: int = INTERPRETER_LIMIT) -> tuple[list[EdgeCase], str]:
    """At most ``limit`` of ``cases``, one per source: the operator family's first structural case,
    NaN and infinities, then the others in their order; (the cases kept, a note naming those left
    out, '' when none was)."""
    if len(cases) <= limit:
        return cases, ""
    firsts: list[EdgeCase] = []
    for c in cases:
        if all(f.source != c.source for f in firsts):
            firsts.append(c)
    nan = [c for c in firsts if c.source == NAN_SOURCE]
    rest = [c for c in firsts if c.source != NAN_SOURCE]
    chosen = {id(c) for c in (rest[:1] + nan + rest[1:])[:limit]}
    kept = [c for c in cases if id(c) in chosen]
    left = [c for c in cases if id(c) not in chosen]
    note = (f"{len(left)} of {len(cases)} edge cases not run: at most {limit} under the Triton interpreter "
            f"(TRITON_INTERPRET=1, no GPU, seconds a call); validate on a GPU for all of them. Not run: "
            + "; ".join(described(c) for c in left))
    return kept, note


def described(case: EdgeCase) -> str:
    """``case`` as a report lists it: its label, and its source where the label does not say it."""
    return case.label if case.source in case.label else f"{case.label} ({case.source})"


def edge_cases(op_name: str, args: list, kwargs: dict, seed: int = 0) -> list[EdgeCase]:
    """Every edge case of a card: structural first, then OpInfo."""
    return structural_cases(op_name, args, kwargs, seed) + opinfo_cases(op_name, args, kwargs)


if __name__ == "__main__":  # python -m modulelens.validation.edge_cases NAME: fill the OpInfo cache for NAME
    import sys

    fill_opinfo_cache(sys.argv[1])
