"""The ``template`` provider: the built-in library of parametrised kernels, offline and deterministic.

A thin adapter over :mod:`modulelens.kernels.templates` (``render(card, backend, variant)`` and
``variants(card, backend)``). Given a parent that came from a template, it returns the next
variant (``parent.params["variant"] + 1``, wrapping around): a deterministic mutation. A requested
``variant`` must exist (0 to ``variants - 1``): one past the end is an error, never a silent wrap.
"""

from __future__ import annotations

from typing import Any

from modulelens.errors import ModuleLensError
from modulelens.kernels import KernelSource, render_template, template_variants
from modulelens.providers.request import GenerationRequest, lineage


class TemplateProvider:
    name = "template"

    def generate(self, req: GenerationRequest, ctx: Any = None) -> KernelSource:
        op = req.card.op
        count = int(template_variants(req.card, req.backend))
        if count <= 0:
            raise ModuleLensError(
                f"no built-in template covers {op} for the {req.backend} backend",
                "use [--provider anthropic] or [--provider sampling], or write the kernel yourself and pass it to validate_kernel",
            )
        if req.parent is not None and req.parent.provider == "template":
            variant = (int(req.parent.params.get("variant", 0)) + 1) % count
        elif req.variant < count:
            variant = req.variant
        else:
            raise ModuleLensError(
                f"variant {req.variant} does not exist for the {req.backend} template of {op}",
                f"its variants are 0 to {count - 1}; leave variant out for the default (0)",
            )
        ks = render_template(req.card, req.backend, variant)
        provenance = {
            **ks.provenance,
            "provider": self.name,
            "template": ks.family,
            "variant": variant,
            "variants": count,
            **lineage(req),
        }
        return ks.model_copy(update={
            "provider": self.name,
            "params": {**ks.params, "variant": variant},
            "provenance": provenance,
        })
