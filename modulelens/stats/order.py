"""Execution order of the modules of a run: the first-call order observed on sampled steps,
refined by the node order of ``torch.fx.symbolic_trace`` when the model can be traced.

Pure functions over names, except :func:`fx_leaf_order` (which traces a module)."""

from __future__ import annotations

import contextlib
import sys
import warnings

import torch
import torch.nn as nn

from modulelens.capture.tracer import strip_wrapper_prefix
from modulelens.wrappers import unwrap


def merge_observed(order: list[str], seen: list[str]) -> None:
    """Add one step's first-call order ``seen`` to the observed ``order`` (in place): a module not
    seen before goes right after the module that ran before it on that step."""
    known = set(order)
    prev: str | None = None
    for name in seen:
        if name not in known:
            pos = order.index(prev) + 1 if prev is not None else 0
            order.insert(pos, name)
            known.add(name)
        prev = name


def execution_order(observed: list[str], root: nn.Module | None, use_fx: bool) -> tuple[list[str], str, str | None]:
    """(order, source, note): the fx-refined order of ``observed`` (source ``"fx"``) when ``use_fx``
    and ``root`` traces; else the observed order (source ``"observed"``) with a note saying why fx
    was not used when tracing failed. Modules outside ``root`` stay where they were observed."""
    if not use_fx or root is None or not observed:
        return list(observed), "observed", None
    leaves, error = fx_leaf_order(unwrap(root))
    if leaves is None:
        return list(observed), "observed", f"torch.fx could not trace the model ({error}); the observed call order is used"
    return combine_order(observed, leaves), "fx", None


def fx_leaf_order(root: nn.Module) -> tuple[list[str] | None, str | None]:
    """Qualified names of the leaf modules in the order ``torch.fx.symbolic_trace`` calls them,
    or (None, why) when it cannot trace. Attributes the forward sets while tracing are restored."""
    saved = {}
    for m in root.modules():
        d = m.__dict__
        saved[id(m)] = (m, dict(d), {k: dict(d[k]) for k in ("_modules", "_parameters", "_buffers") if k in d})
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(sys.stderr):
            warnings.simplefilter("ignore")
            gm = torch.fx.symbolic_trace(root)
        names: list[str] = []
        for node in gm.graph.nodes:
            if node.op == "call_module":
                n = strip_wrapper_prefix(str(node.target))
                if n not in names:
                    names.append(n)
        return names, None
    except Exception as e:  # noqa: BLE001 - any failure means: use the observed order
        first = (str(e).strip().splitlines() or [""])[0]
        return None, f"{type(e).__name__}: {first[:160]}"
    finally:
        for m, d, inner in saved.values():
            m.__dict__.clear()
            m.__dict__.update(d)
            for k, v in inner.items():
                m.__dict__[k].clear()
                m.__dict__[k].update(v)


def combine_order(observed: list[str], fx_leaves: list[str]) -> list[str]:
    """The observed modules ordered by the fx leaf order: a container goes right before its first
    leaf (parents before children); a module fx did not see goes after every module observed to run
    before it."""
    rank = {n: i for i, n in enumerate(fx_leaves)}

    def key_of(name: str) -> int | None:
        best = rank.get(name)
        prefix = name + "."
        for leaf, r in rank.items():
            if name == "" or leaf.startswith(prefix):
                best = r if best is None else min(best, r)
        return best

    keys = {n: key_of(n) for n in observed}
    ranked = sorted((n for n in observed if keys[n] is not None), key=lambda n: (keys[n], 0 if n == "" else n.count(".") + 1))
    out = list(ranked)
    for i, n in enumerate(observed):
        if keys[n] is None:  # after everything that was observed to run before it
            before = [out.index(p) for p in observed[:i] if p in out]
            out.insert(max(before) + 1 if before else 0, n)
    return out
