"""What the card tools return: an opset's ranked cards in brief, and one card in full."""

from __future__ import annotations

from typing import Any, Self

from pydantic import BaseModel, Field

from modulelens.ops.cards import open_card, open_opset
from modulelens.ops.model import CardSample, OpCard, OpKind, OpSetManifest, Phase
from modulelens.repo import Repository


class CardSummary(BaseModel):
    card_id: str = Field(description="Use with show-op-card, replay-op-card, profile.")
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

    @classmethod
    def of(cls, card: OpCard, **extra: Any) -> Self:
        """The summary (or, for a subclass, the record with ``extra`` fields) of a stored card."""
        fields = card.model_dump(include=set(CardSummary.model_fields) - {"card_id"})
        return cls(card_id=card.card_id, **fields, **extra)


class OpSetSummary(BaseModel):
    opset: str = Field(description="Reference of the stored opset (cards are <opset>/<index>).")
    capture: str
    strategy: str
    module_time_s: float = Field(description="Median plain run time of the module (same runs as the shares).")
    module_time_p20_s: float
    module_time_p80_s: float
    repeats: int
    cards_time_share: float = Field(description="Sum of the listed cards' shares: the part of the run inside operators.")
    views_time_share: float = Field(description="Share spent in view/metadata operators.")
    cards: list[CardSummary]
    notes: list[str] = Field(default_factory=list)


class CardDetail(CardSummary):
    opset: str
    capture: str
    samples: list[CardSample] = Field(description="Stored sample calls: args, kwargs and output as value specs.")


def summarize_opset(repo: Repository, ref: str, kind: str | None = None, top: int | None = None) -> OpSetSummary:
    """The opset ``ref`` with its cards in rank order: only those of ``kind`` when given, at most
    ``top`` of them when given. ``cards_time_share`` always covers every card of the opset."""
    art, m = open_opset(repo, ref)
    cards = [CardSummary.of(c) for c in m.cards if kind is None or c.kind == kind]
    mt = m.module_time
    return OpSetSummary(
        opset=art.ref, capture=m.capture, strategy=m.strategy, module_time_s=mt.median_s,
        module_time_p20_s=mt.p20_s, module_time_p80_s=mt.p80_s, repeats=mt.repeats,
        cards_time_share=m.cards_time_share, views_time_share=m.views_time_share,
        cards=cards[:top] if top else cards, notes=m.notes,
    )


def describe_card(repo: Repository, card_id: str) -> CardDetail:
    """One card in full, with the opset and capture it belongs to."""
    art, card = open_card(repo, card_id)
    capture = art.manifest_as(OpSetManifest).capture
    return CardDetail.of(card, opset=art.ref, capture=capture, samples=card.samples)


def render_opset(r: OpSetSummary):
    """A rich table of the cards, with the module's run time and the shares in the caption."""
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=escape(f"operator cards {r.opset} (from {r.capture}, {r.strategy})"), title_justify="left")
    for col in ("card", "op", "kind", "shapes", "dtypes", "calls", "time/run", "share"):
        t.add_column(col)
    for c in r.cards:
        t.add_row(escape(c.card_id), escape(c.op), c.kind + ("" if c.phase == "forward" else " (bw)"),
                  escape(" ".join(str(s) for s in c.shapes)), escape(",".join(sorted(set(c.dtypes)))), str(c.calls),
                  f"{c.time_s * 1e6:.1f} us", f"{c.time_share:.1%}")
    t.caption = (f"module run: median {r.module_time_s * 1e3:.3f} ms (p20 {r.module_time_p20_s * 1e3:.3f}, "
                 f"p80 {r.module_time_p80_s * 1e3:.3f}) over {r.repeats} runs; listed cards cover "
                 f"{r.cards_time_share:.0%} of it, view operators {r.views_time_share:.0%}"
                 + escape("".join(f"\nnote: {n}" for n in r.notes)))
    return t
