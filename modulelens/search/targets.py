"""What an optimize target names, and each card's roofline bound.

A target is a card id (``blk/6``, ``blk:v1/6``) or a capture reference (``blk``): then its latest
opset's top cards by *time share x headroom*, where headroom is the card's eager time per call
over its roofline bound (bytes moved per call / this machine's copy bandwidth); cards without a
bound (compute cards) count a headroom of 1. For the template provider only cards a template fits
are taken. Here a capture target means its cards; the module itself (``ModelNew`` candidates) is
searched by :mod:`modulelens.search.modules`.
"""

from __future__ import annotations

from collections.abc import Callable

from modulelens.errors import ModuleLensError
from modulelens.ops.cards import open_card, open_opset
from modulelens.ops.model import OpCard, is_card_id
from modulelens.repo import Repository
from modulelens.search.model import SearchSettings, SearchTarget

CopyBandwidth = Callable[[str], float | None]


def machine_copy_bandwidth(device: str) -> float | None:
    """This machine's copy bandwidth on ``device`` (measured once, then cached), or None when the
    device is not on this machine (:func:`~modulelens.profiling.bandwidth.copy_bytes_per_s`)."""
    from modulelens.profiling.bandwidth import copy_bytes_per_s

    return copy_bytes_per_s(device)


def _target(card: OpCard, index: int, bandwidth: float | None) -> SearchTarget:
    eager = card.time_s / card.calls if card.calls else None
    bound = card.bytes_per_call / bandwidth if card.kind == "memory" and bandwidth and card.bytes_per_call else None
    return SearchTarget(index=index, card_id=card.card_id, op=card.op, kind=card.kind, time_share=card.time_share,
                        eager_s=eager, bound_s=bound)


def _fits(card: OpCard, settings: SearchSettings) -> bool:
    if not card.shapes or card.kind == "view":
        return False
    if settings.provider != "template":
        return True
    from modulelens.kernels import templates

    return templates.variants(card, settings.backend) > 0


def _headroom(t: SearchTarget) -> float:
    return t.eager_s / t.bound_s if t.eager_s and t.bound_s else 1.0


def resolve_targets(repo: Repository, refs: list[str], settings: SearchSettings, top: int,
                    bandwidth: CopyBandwidth = machine_copy_bandwidth) -> list[SearchTarget]:
    """The cards ``refs`` name, each once, in order (a capture's cards by time share x headroom)."""
    if not refs:
        raise ModuleLensError("optimize needs at least one target", "give a card id (blk/6) or a capture (blk)")
    cards: list[OpCard] = []
    for ref in refs:
        if is_card_id(ref):
            cards.append(open_card(repo, ref)[1])
            continue
        _, opset = open_opset(repo, ref)
        fitting = [c for c in opset.cards if _fits(c, settings)]
        if not fitting:
            raise ModuleLensError(f"no card of {opset.ref} can be searched with the {settings.provider} provider "
                                  f"and the {settings.backend} backend",
                                  "list its cards with list (kind cards); name a card, or use [--provider anthropic]")
        bw = bandwidth(opset.device)
        ranked = sorted(fitting, key=lambda c: -c.time_share * _headroom(_target(c, 0, bw)))
        cards.extend(ranked[:top])
    out: list[SearchTarget] = []
    for card in cards:
        if card.card_id not in [t.card_id for t in out]:
            out.append(_target(card, len(out), bandwidth(card.device)))
    return out
