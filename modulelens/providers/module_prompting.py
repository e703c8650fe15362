"""What modulelens says to an LLM for a module-level candidate: the ``ModelNew`` prompts (templates
``module_system``, ``generate_module`` and ``repair_module`` in ``modulelens/prompts/``) filled from a
:class:`~modulelens.providers.module_request.ModuleRequest`. The reply is read like a Python kernel's
(:func:`~modulelens.providers.prompting.extract_code` with ``MODULE_LANGUAGE``).
"""

from __future__ import annotations

from modulelens.providers.module_request import ModuleRequest
from modulelens.providers.prompting import user_prompt

MODULE_LANGUAGE = "triton"  # a Python source: extract_code prefers ```python blocks for it


def module_contract_text() -> str:
    """The module candidate contract, as :mod:`modulelens.kernels.module_candidates` states it."""
    from modulelens.kernels import MODULE_CANDIDATE_CONTRACT

    doc = (MODULE_CANDIDATE_CONTRACT or "").split("\n\n")[1]
    return " ".join(doc.split()).replace("``", "`")


def _bullets(lines: list[str], empty: str) -> str:
    return "\n".join(f"- {line}" for line in lines) if lines else f"- {empty}"


def module_text(req: ModuleRequest) -> str:
    """The module's description shared by the fresh and repair prompts."""
    where = f" at `{req.module_path}`" if req.module_path else ""
    parts = [f"Module: `{req.class_path}`{where} (capture {req.capture}), called in "
             f"{'training' if req.training else 'eval'} mode."]
    if req.class_source:
        parts.append(f"Its class:\n```python\n{req.class_source.strip()}\n```")
    elif req.forward_source:
        parts.append(f"Its forward (the class is too long to show whole):\n```python\n{req.forward_source.strip()}\n```")
    else:
        parts.append("Its source is not available here; write ModelNew from the signature and shapes below.")
    parts.append(f"`forward{req.signature}` was called with:\n{_bullets(req.inputs, 'no arguments')}\n"
                 f"and returned: {req.outputs}")
    parts.append("`ModelNew` is constructed with the module's constructor arguments:\n"
                 + _bullets(req.construction, "none recorded (construct it without arguments)"))
    parts.append("Its parameters and buffers (loaded into ModelNew by these names, strictly):\n"
                 + _bullets(req.weights, "none"))
    if req.training:
        parts.append("It must also be correct in training mode, gradients included: compose differentiable "
                     "operations, or write a `torch.autograd.Function` with its own backward.")
    return "\n\n".join(parts)


def build_module_messages(req: ModuleRequest) -> tuple[str, str]:
    """(system prompt, user prompt) for ``req``: ``repair_module`` when a parent and its report are
    given, ``generate_module`` otherwise."""
    from modulelens.prompts import render

    fields = {
        "module": module_text(req),
        "instructions": f"\nAdditional instructions:\n{req.instructions.strip()}\n" if req.instructions else "",
        "variant_note": (f"\nThis is attempt {req.variant}: take a different approach (which operators to fuse, "
                         "work split, vectorisation) than the most obvious one.\n" if req.variant else ""),
    }
    return (render("module_system", contract=module_contract_text()),
            user_prompt(req, fields, "repair_module", "generate_module"))
