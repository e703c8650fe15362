"""What the card tools return: an opset's ranked cards in brief, and one card in full."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Self

from pydantic import BaseModel, Field

from modulelens.listing import LeftOut, keep_first
from modulelens.ops.cards import open_card, open_opset
from modulelens.ops.model import CardSample, OpCard, OpKind, OpSetManifest, Phase
from modulelens.replies import ToolReply
from modulelens.repo import MANIFEST, Repository


class CardSummary(BaseModel):
    card_id: str = Field(description="Use with show (kind card), replay_module, profile. The same for the same "
                         "operator and call site in every capture of the module.")
    rank: int | None = Field(None, description="Its place by time share (0: the largest); may change between runs.")
    op: str = Field(description="aten operator overload.")
    kind: OpKind = Field(description="memory (bandwidth-bound), compute (matmul/conv/attention) or view.")
    phase: Phase = Field(description="forward or backward.")
    shapes: list[list[int]]
    dtypes: list[str]
    strides: list[list[int] | None]
    contiguous: list[bool]
    device: str
    args: list[Any] = Field(description="Non-tensor arguments.")
    calls: int = Field(description="Calls of this variant in one module run.")
    time_s: float = Field(description="Median seconds spent in this variant per module run.")
    time_share: float = Field(description="time_s divided by the measured module run time.")
    bytes_per_call: int = Field(description="Bytes of distinct input and output tensors per call.")
    achieved_bytes_per_s: float | None = Field(
        None, description="Memory-bound cards: bytes_per_call * calls / time_s (None for compute and view cards).")
    roofline_fraction: float | None = Field(
        None, description="achieved_bytes_per_s / this machine's copy bandwidth (the opset's copy_bytes_per_s); above "
        "1 means the data sat in cache. None when either is unknown.")

    @classmethod
    def of(cls, card: OpCard, copy_bytes_per_s: float | None = None, **extra: Any) -> Self:
        """The summary (or, for a subclass, the record with ``extra`` fields) of a stored card, with
        its roofline against ``copy_bytes_per_s`` when given."""
        fields = card.model_dump(include=set(CardSummary.model_fields) - {"card_id"})
        achieved = achieved_bytes_per_s(card)
        fraction = achieved / copy_bytes_per_s if achieved is not None and copy_bytes_per_s else None
        return cls(card_id=card.card_id, **fields, achieved_bytes_per_s=achieved, roofline_fraction=fraction, **extra)


def achieved_bytes_per_s(card: OpCard) -> float | None:
    """The bandwidth a memory-bound card achieves: bytes of distinct inputs and outputs per call,
    times calls per module run, over its median seconds per run. None for compute cards (bound by
    arithmetic, which cards do not record), view cards and cards without a time."""
    if card.kind != "memory" or card.time_s <= 0:
        return None
    return card.bytes_per_call * card.calls / card.time_s


SHARE_SUM_RANGE = (0.5, 1.15)
"""The time inside operators (listed cards and views, as shares of the plain module run) outside
this range means the per-operator timing and the plain runs disagree: over 1 is more time inside
operators than in the whole run; well under 1 leaves most of the run unexplained."""


def time_share_warnings(m: OpSetManifest) -> list[str]:
    """A warning when the opset's time shares do not add up to about 1 (see :data:`SHARE_SUM_RANGE`):
    the profile is inconsistent (a loaded machine, timer overhead, too few repeats) and its shares
    should not be trusted. View cards listed among the cards are counted once. Empty when consistent."""
    views_listed = any(c.kind == "view" for c in m.cards)
    total = m.cards_time_share + (0.0 if views_listed else m.views_time_share)
    low, high = SHARE_SUM_RANGE
    if low <= total <= high:
        return []
    mt = m.module_time
    what = ("more than the whole run" if total > high
            else "leaving most of the run outside the recorded operators")
    return [
        f"time shares are inconsistent: the operators add up to {total:.0%} of the module's run time, {what} "
        f"(plain runs took {mt.p20_s * 1e3:.3g} ms to {mt.p80_s * 1e3:.3g} ms, p20 to p80, over {mt.repeats} "
        "repeats); the machine was probably busy: run capture_ops again on a quieter machine or with more "
        "repeats before ranking cards by share"
    ]


NOISY_SPREAD = 2.0
"""A module whose plain runs' p80 is more than this many times their p20 was timed on a busy
machine (or runs work that varies): its time shares, and so the cards' ranks, are noise."""


def module_time_warnings(m: OpSetManifest) -> list[str]:
    """A warning when the module's plain runs spread widely (see :data:`NOISY_SPREAD`); empty otherwise."""
    mt = m.module_time
    if mt.p20_s <= 0 or mt.p80_s / mt.p20_s <= NOISY_SPREAD:
        return []
    return [f"the module's run time is noisy: p20 {mt.p20_s * 1e3:.3g} ms to p80 {mt.p80_s * 1e3:.3g} ms "
            f"({mt.p80_s / mt.p20_s:.0f}x) over {mt.repeats} repeats, so the time shares and the cards' rank are "
            "not to be trusted (card ids do not depend on rank): run capture_ops again on a quieter machine or with "
            "more repeats"]


CopyBandwidth = Callable[[str], float | None]
"""device -> this machine's copy bandwidth in bytes per second, or None when unknown here."""


class OpSetSummary(ToolReply):
    opset: str = Field(description="Reference of the stored opset (cards are <opset>/<index>).")
    capture: str
    strategy: str
    device: str = "cpu"
    copy_bytes_per_s: float | None = Field(None, description="This machine's copy bandwidth on the opset's device: "
                                           "the ceiling of the cards' roofline_fraction.")
    module_time_s: float = Field(description="Median plain run time of the module (same runs as the shares).")
    module_time_p20_s: float
    module_time_p80_s: float
    repeats: int
    cards_time_share: float = Field(description="Sum of the listed cards' shares: the part of the run inside operators.")
    views_time_share: float = Field(description="Share spent in view/metadata operators.")
    cards: list[CardSummary]
    notes: list[str] = Field(default_factory=list)
    left_out: list[LeftOut] = Field(default_factory=list, description="Lists cut to `top` items.")


class CardDetail(CardSummary, ToolReply):
    opset: str
    capture: str
    samples: list[CardSample] = Field(description="Stored sample calls: args, kwargs and output as value specs.")


def summarize_opset(repo: Repository, ref: str, kind: str | None = None, top: int | None = None,
                    copy_bandwidth: CopyBandwidth | None = None) -> OpSetSummary:
    """The opset ``ref`` with its cards in rank order: only those of ``kind`` when given, at most
    ``top`` of them when given (``left_out`` then names the manifest, which has them all). ``cards_time_share`` always covers every card of the opset. With
    ``copy_bandwidth``, memory-bound cards get their roofline fraction (a note says when the
    machine has no bandwidth for the opset's device)."""
    art, m = open_opset(repo, ref)
    ceiling = copy_bandwidth(m.device) if copy_bandwidth is not None else None
    notes = list(m.notes)
    if copy_bandwidth is not None and not ceiling:
        notes.append(f"no copy bandwidth for device {m.device!r} on this machine: no roofline fractions")
    cards = [CardSummary.of(c, ceiling) for c in m.cards if kind is None or c.kind == kind]
    mt = m.module_time
    summary = OpSetSummary(
        opset=art.ref, capture=m.capture, strategy=m.strategy, device=m.device, copy_bytes_per_s=ceiling,
        module_time_s=mt.median_s, module_time_p20_s=mt.p20_s, module_time_p80_s=mt.p80_s, repeats=mt.repeats,
        cards_time_share=m.cards_time_share, views_time_share=m.views_time_share,
        cards=cards, notes=notes, warnings=module_time_warnings(m) + time_share_warnings(m),
    )
    return keep_first(summary, "cards", top, str(art.path / MANIFEST))


def describe_card(repo: Repository, card_id: str) -> CardDetail:
    """One card in full, with the opset and capture it belongs to."""
    art, card = open_card(repo, card_id)
    capture = art.manifest_as(OpSetManifest).capture
    return CardDetail.of(card, opset=art.ref, capture=capture, samples=card.samples)
