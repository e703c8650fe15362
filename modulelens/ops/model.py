"""The records of an opset artifact: its manifest, its operator cards and their sample calls.

One ``capture_ops`` run writes an *opset* (kind ``opsets``, named like the capture) whose manifest
is an :class:`OpSetManifest`: the cards ranked by time share, with their sample calls' tensors in
``samples.safetensors``. Every reader goes through these models
(``artifact.manifest_as(OpSetManifest)``); nothing reads the stored JSON by string key.

A card is addressed as ``<opset ref>/<index>`` (``blk/0``: latest opset of ``blk``, the card of
call site 0; ``blk:v2/3``; ``blk@prod/1``). The index is the card's call site, not its rank (which
a noisy timing may change): the same operator at the same call site of the same module has the
same id in every repository and rerun. The id is not stored: the opset's version is only known once the
store has written it. :func:`format_card_id` is the one place that builds an id and
:func:`parse_card_id` the one place that reads one; :attr:`OpCard.card_id` derives a card's id
from the opset that holds it. Opsets written before the id was derived stored ``card_id: "?/N"``
in every card; that field is ignored when they load.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from modulelens.errors import ModuleLensError, ReferenceNotFound, tool_call
from modulelens.repo import ManifestBase

KIND = "opsets"
SAMPLES_FILE = "samples.safetensors"

# Stored cards hold Python floats that JSON has no literal for (an argument of -inf): write them
# as json.dumps does (-Infinity, NaN), not as null.
_KEEP_NON_FINITE = ConfigDict(ser_json_inf_nan="constants")

OpKind = Literal["memory", "compute", "view"]
Phase = Literal["forward", "backward"]


def format_card_id(opset_ref: str, index: int) -> str:
    """The id of card ``index`` of the opset ``opset_ref`` (``blk:v2`` and 3 give ``blk:v2/3``)."""
    return f"{opset_ref}/{index}"


def parse_card_id(card_id: str) -> tuple[str, int]:
    """(opset reference, card index) of a card id; the inverse of :func:`format_card_id`."""
    ref, sep, index = card_id.strip().rpartition("/")
    if not sep or not ref or not index.isdigit():
        raise ModuleLensError(
            f"invalid card id {card_id!r}",
            "card ids look like 'blk/0' (latest opset of blk) or 'blk:v2/3'; list an opset's cards with list (kind cards)",
        )
    return ref, int(index)


def is_card_id(text: str) -> bool:
    """Whether ``text`` has the form of a card id (it may still name no card)."""
    return "/" in text and text.rpartition("/")[2].isdigit()


class CardSample(BaseModel):
    """One recorded call of a card's variant. ``args``, ``kwargs`` and ``output`` are value specs
    (their format belongs to :mod:`modulelens.capture.values`) whose tensors are in the opset's
    ``samples.safetensors``; ``rng`` names the CPU RNG state saved before the call (random
    operators only)."""

    model_config = _KEEP_NON_FINITE

    args: Any = Field(default_factory=lambda: {"$": "list", "items": []})
    kwargs: Any = Field(default_factory=lambda: {"$": "dict", "items": []})
    output: Any = None
    rng: str | None = None


class OpCard(BaseModel):
    """One operator variant: an op overload called with one combination of input shapes, dtypes,
    strides, device and non-tensor arguments, with its calls per module run, measured time and up
    to K sample calls (inputs and eager outputs: the oracle for validation).

    Every field but ``op`` has a default so that cards made by hand (tests, prompts) validate;
    cards written by ``capture_ops`` set them all.
    """

    model_config = ConfigDict(extra="ignore", **_KEEP_NON_FINITE)  # ignores the "card_id": "?/N" older opsets stored

    index: int = Field(0, description="Its call site: the place of its variant in the order the module first calls "
                       "them (views counted, forward then backward), the same for the same operator at the same call "
                       "site in every capture and rerun of the module. The card id ends with it. (Opsets written "
                       "before call sites were numbered: its rank.)")
    rank: int | None = Field(None, description="Its place by time share in its opset (0: the largest); it may "
                             "change from run to run, the id does not. None until read from an opset.")
    op: str = Field(description="aten operator overload, e.g. aten.addmm.default.")
    kind: OpKind = Field("compute", description="memory (bandwidth-bound), compute (matmul/conv/attention) or view.")
    phase: Phase = "forward"
    shapes: list[list[int]] = Field(default_factory=list, description="Shapes of the tensor inputs, in call order.")
    dtypes: list[str] = Field(default_factory=list)
    strides: list[list[int] | None] = Field(default_factory=list)
    contiguous: list[bool] = Field(default_factory=list)
    device: str = "cpu"
    args: list[Any] = Field(default_factory=list, description="Non-tensor arguments.")
    calls: int = Field(0, description="Calls of this variant in one module run.")
    time_s: float = Field(0.0, description="Median seconds spent in this variant per module run.")
    time_share: float = Field(0.0, description="time_s divided by the measured module run time.")
    bytes_per_call: int = Field(0, description="Bytes of distinct input and output tensors per call.")
    uninitialised_output: bool = Field(False, description="The output is uninitialised memory (empty, ...).")
    samples: list[CardSample] = Field(default_factory=list)

    _opset_ref: str | None = PrivateAttr(None)

    @property
    def card_id(self) -> str:
        """``<opset ref>/<index>``, for a card read from a stored opset."""
        if self._opset_ref is None:
            raise ValueError(f"card {self.index} ({self.op}) was not read from a stored opset, so it has no id")
        return format_card_id(self._opset_ref, self.index)

    def bind(self, opset_ref: str) -> OpCard:
        """Attach the card to the opset that holds it (what :attr:`card_id` is derived from)."""
        self._opset_ref = opset_ref
        return self


def as_card(card: OpCard | Mapping[str, Any]) -> OpCard:
    """``card`` as an :class:`OpCard`; a mapping is read as a card's stored JSON form (what
    :func:`modulelens.kernels.templates.synthetic_card` returns and tests write by hand)."""
    return card if isinstance(card, OpCard) else OpCard.model_validate(dict(card))


class ModuleTime(BaseModel):
    """Plain run time of the module, from the runs interleaved with the timed ones."""

    median_s: float
    p20_s: float
    p80_s: float
    repeats: int


class OpSetManifest(ManifestBase):
    """The manifest of an ``opsets`` artifact."""

    model_config = _KEEP_NON_FINITE  # merged with ManifestBase's extra="allow"

    capture: str = Field("", description="Reference of the capture the operators were recorded from.")
    strategy: str = Field("", description="Replay strategy that rebuilt the module.")
    device: str = "cpu"
    backward: bool = False
    module_time: ModuleTime
    views_time_share: float = Field(0.0, description="Share of the module's run spent in view/metadata operators.")
    cards: list[OpCard] = Field(default_factory=list, description="Ranked by time share (card i has rank i); "
                                "each card's index is its call site (see OpCard.index).")
    notes: list[str] = Field(default_factory=list)
    timer: str = ""

    @model_validator(mode="after")
    def _bind_cards(self) -> OpSetManifest:
        for rank, card in enumerate(self.cards):
            if card.rank is None:  # written before ranks were stored: the list is in rank order
                card.rank = rank
        if self.ref:  # empty while the manifest is being written: the store assigns the version
            for card in self.cards:
                card.bind(self.ref)
        return self

    @property
    def cards_time_share(self) -> float:
        """Sum of the cards' shares: the part of the module's run inside the listed operators."""
        return sum(c.time_share for c in self.cards)

    def card(self, index: int) -> OpCard:
        """The card whose index (call site) is ``index``; a clear error when there is no such card."""
        found = next((c for c in self.cards if c.index == index), None)
        if found is None:
            indexes = sorted(c.index for c in self.cards)
            shown = ", ".join(map(str, indexes[:12])) + (", ..." if len(indexes) > 12 else "")
            raise ReferenceNotFound(
                f"opset {self.ref} has no card {index}",
                f"its cards are {shown or 'none'}; list them with {tool_call('list', kind='cards', of=self.ref)}",
            )
        return found
