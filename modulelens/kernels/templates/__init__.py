"""The template library: parametrised kernels for common operator families (deterministic, offline).

``match(card)`` says which family fits an operator card and with which parameters (derived from
the card's stored sample: shapes, strides, dtypes, dim, eps, approximate, ...);
``render(card, backend, variant)`` gives the :class:`KernelSource` of one parameter variant
(block sizes, thread counts, parallel grain), following the candidate contract
(:mod:`modulelens.kernels.source`); ``variants(card, backend)`` says how many variants there are
(a search uses them as mutations). Kernels are specialised to the card: shapes and strides are
baked in and checked on entry, and outputs are allocated with the eager outputs' strides; families
that define ``shape_rule`` (elementwise, layer_norm, rms_norm, softmax, softmax_backward, reduction,
pooling) let some dimensions vary instead: their kernels read those sizes at run time and declare
the rule in their source (:mod:`modulelens.kernels.shape_rules`). group_norm has none: its batch is
also an integer argument (``native_group_norm(x, w, b, N, C, HxW, group, eps)``), and a rule names
tensor dimensions only, so validation could not redraw N with the batch nor a pack guard tie them.

Families (one module each, holding the cpp, triton and, where it fits, cuda templates):
elementwise, softmax, softmax_backward, layer_norm, rms_norm, group_norm, reduction, pooling.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from modulelens.errors import ModuleLensError
from modulelens.kernels.source import KernelSource
from modulelens.kernels.templates import (
    elementwise,
    group_norm,
    layer_norm,
    pooling,
    reduction,
    rms_norm,
    softmax,
    softmax_backward,
)
from modulelens.kernels.templates.call import NoMatch, call_from_card, jsonable
from modulelens.ops.model import CardSample, OpCard, as_card

CardLike = OpCard | Mapping[str, Any]  # a card, or its stored JSON form

FAMILY_MODULES = (elementwise, softmax, softmax_backward, layer_norm, rms_norm, group_norm, reduction, pooling)
BACKENDS = ("cpp", "triton", "cuda")
# Tensor dtypes each backend's templates take.
SUPPORTED_DTYPES = {
    "cpp": ("float32", "float64"),
    "triton": ("float32", "float16", "bfloat16"),
    "cuda": ("float32", "float16", "bfloat16"),
}

__all__ = ["TemplateMatch", "families", "match", "why_not", "render", "variants", "variant_params", "synthetic_card", "SUPPORTED_DTYPES"]


@dataclass(frozen=True)
class TemplateMatch:
    family: str
    op: str
    params: dict[str, Any]
    backends: tuple[str, ...]


def families() -> dict[str, dict[str, list[str]]]:
    """Every family with the operators it covers and the backends it has templates for."""
    return {m.FAMILY: {"ops": list(m.OPS), "backends": list(m.BACKENDS)} for m in FAMILY_MODULES}


def _family_list() -> str:
    return "; ".join(f"{m.FAMILY} ({', '.join(o.removeprefix('aten.') for o in m.OPS)})" for m in FAMILY_MODULES)


def _module_for(op: str):
    for m in FAMILY_MODULES:
        if op in m.OPS:
            return m
    return None


def _resolve(card: OpCard):
    """(module, call, params) or raises NoMatch with the reason."""
    op = card.op
    module = _module_for(op)
    if module is None:
        raise NoMatch(f"no template family covers {op}")
    call = call_from_card(card)
    try:
        return module, call, module.match(call)
    except (ValueError, IndexError, KeyError, TypeError) as e:  # arguments unlike the operator's schema
        raise NoMatch(f"unexpected arguments for {op} ({e})") from None


def match(card: CardLike) -> TemplateMatch | None:
    """The family and parameters that fit ``card``, or None (see :func:`why_not` for the reason)."""
    card = as_card(card)
    try:
        module, _, params = _resolve(card)
    except NoMatch:
        return None
    return TemplateMatch(family=module.FAMILY, op=card.op, params=jsonable(params), backends=tuple(module.BACKENDS))


def why_not(card: CardLike, backend: str | None = None) -> str | None:
    """Why no template fits ``card`` (for ``backend``, when given); None when one does."""
    try:
        module, call, _ = _resolve(as_card(card))
    except NoMatch as e:
        return str(e)
    if backend is not None:
        if backend not in module.BACKENDS:
            return f"the {module.FAMILY} family has no {backend} template (it has {', '.join(module.BACKENDS)})"
        bad = sorted({t.dtype for t in call.tensors} - set(SUPPORTED_DTYPES[backend]))
        if bad:
            return f"the {backend} templates take {', '.join(SUPPORTED_DTYPES[backend])} tensors, not {', '.join(bad)}"
    return None


def variants(card: CardLike, backend: str) -> int:
    """How many parameter variants ``render(card, backend, i)`` has (0 when no template fits)."""
    card = as_card(card)
    if why_not(card, backend) is not None:
        return 0
    module, _, params = _resolve(card)
    return len(module.variants(backend, params))


def variant_params(card: CardLike, backend: str) -> list[dict[str, Any]]:
    """The parameters of each variant ``render(card, backend, i)`` has (empty when no template
    fits): the search space a tree search walks, one parameter change at a time."""
    card = as_card(card)
    if why_not(card, backend) is not None:
        return []
    module, _, params = _resolve(card)
    return [dict(v) for v in module.variants(backend, params)]


def render(card: CardLike, backend: str, variant: int = 0) -> KernelSource:
    """The template source for ``card`` on ``backend``, variant ``variant`` (0 is the default)."""
    if backend not in BACKENDS:
        raise ModuleLensError(f"unknown backend {backend!r}", "use cpp, cuda or triton")
    card = as_card(card)
    op = card.op
    try:
        module, call, params = _resolve(card)
    except NoMatch as e:
        raise ModuleLensError(f"no template fits {op}: {e}", f"template families: {_family_list()}") from None
    if backend not in module.BACKENDS:
        raise ModuleLensError(f"the {module.FAMILY} family has no {backend} template",
                              f"it has {', '.join(module.BACKENDS)} templates; pick one of those backends")
    bad = sorted({t.dtype for t in call.tensors} - set(SUPPORTED_DTYPES[backend]))
    if bad:
        raise ModuleLensError(
            f"the {backend} templates do not take {', '.join(bad)} tensors ({op})",
            f"supported dtypes for {backend}: {', '.join(SUPPORTED_DTYPES[backend])}")
    options = module.variants(backend, params)
    if not 0 <= variant < len(options):
        raise ModuleLensError(f"variant {variant} does not exist for {module.FAMILY}/{backend}",
                              f"variants are 0 to {len(options) - 1}")
    vparams = options[variant]
    rule_of = getattr(module, "shape_rule", None)
    rule = rule_of(call, params, backend, vparams) if rule_of else None
    try:
        source = getattr(module, f"render_{backend}")(call, {**params, "rule": rule}, vparams, variant)
    except NoMatch as e:
        raise ModuleLensError(f"no {backend} template fits {op}: {e}", f"template families: {_family_list()}") from None
    return KernelSource(
        backend=backend, source=source, entry="forward", family=module.FAMILY,
        params={**jsonable(params), **vparams, "variant": variant,
                **({"variable_dims": rule.text()} if rule else {})}, provider="template",
        provenance={"template": module.FAMILY, "variant": variant},
    )


# ---------------------------------------------------------------------------------------------

def synthetic_card(op: str, args: list, kwargs: dict | None = None, output: Any = None) -> dict[str, Any]:
    """A card for a call made up here (tests, benchmarks), in the stored JSON form ``capture_ops``
    writes: the sample's structure but no stored tensors. ``output`` defaults to running the eager
    operator."""
    import torch

    from modulelens.capture.values import Encoder, TensorSink
    from modulelens.ops.recorder import classify, resolve_op, variant_key

    class _SpecOnly(TensorSink):
        def add(self, key: str, t: torch.Tensor) -> dict[str, Any]:
            return {"$": "tensor", "key": self.prefix + key, "shape": list(t.shape),
                    "dtype": str(t.dtype).removeprefix("torch."), "device": str(t.device),
                    "stride": list(t.stride()), "contiguous": t.is_contiguous(), "requires_grad": False,
                    "stored": False}

    func = resolve_op(op)
    kwargs = dict(kwargs or {})
    if output is None:
        output = func(*args, **kwargs)
    _, tensors, others = variant_key(func, tuple(args), kwargs)
    enc = Encoder(_SpecOnly())
    sample = CardSample(args=enc.encode(list(args), "args"), kwargs=enc.encode(kwargs, "kwargs"),
                        output=enc.encode(output, "output"))
    card = OpCard(
        index=0, op=op, kind=classify(func), phase="forward",
        shapes=[t["shape"] for t in tensors], dtypes=[t["dtype"] for t in tensors],
        strides=[t["stride"] for t in tensors], contiguous=[t["contiguous"] for t in tensors],
        device=tensors[0]["device"] if tensors else "cpu", args=others, calls=1, samples=[sample],
    )
    return card.model_dump(mode="json")
