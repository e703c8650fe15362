"""Ask a provider for a candidate kernel for an operator card, and store it."""

from __future__ import annotations

from typing import Any

from modulelens.callbacks import ProgressFn
from modulelens.kernels import BackendName, KernelSource, load_candidate, save_candidate
from modulelens.ops import open_card
from modulelens.providers.base import get_provider
from modulelens.providers.request import GenerationRequest
from modulelens.repo import Artifact, Repository


def generate_candidate(repo: Repository, card_id: str, backend: BackendName, provider: str, ctx: Any, *,
                       parent: str | None = None, parent_report: dict[str, Any] | None = None,
                       instructions: str | None = None,
                       variant: int = 0,
                       progress: ProgressFn | None = None,
                       ) -> tuple[Artifact, KernelSource]:
    """A new candidate for ``card_id`` from ``provider``, stored with its provenance. With
    ``parent`` (a candidate id), the provider gets its source and ``parent_report`` (its latest
    validation report as JSON, looked up by the caller) to repair or improve. ``ctx`` is the tool
    context (the sampling provider asks the MCP client through it)."""
    _, card = open_card(repo, card_id)
    parent_src = load_candidate(repo, parent)[1] if parent else None
    if progress:
        progress(0, 1, f"asking the {provider} provider for a {backend} kernel for {card.op}")
    request = GenerationRequest(card=card, backend=backend, parent=parent_src,
                                parent_report=parent_report, instructions=instructions, variant=variant)
    src = get_provider(provider).generate(request, ctx)
    return save_candidate(repo, card, src, parent=parent), src
