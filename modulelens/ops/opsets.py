"""Read-only views of the opsets in a repository: one row per opset, and the roofline of its cards.

:class:`OpsetListing` is the typed view of an ``opsets`` manifest that these views read (the
fields ``capture_ops`` writes today). It stands in for the opset model ``ops/`` will own; unknown
fields are kept, so any opset written so far loads.

The roofline of a memory-bound card is its achieved bandwidth, ``bytes_per_call * calls / time_s``
(bytes of distinct inputs and outputs per call, over the median seconds the card spends per module
run), as a fraction of this machine's measured copy bandwidth. Compute cards (matmul, convolution,
attention) are bound by arithmetic, which cards do not record: they get no fraction.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from modulelens.ops.cards import KIND
from modulelens.repo import ManifestBase, Repository


class ModuleTime(BaseModel):
    median_s: float = 0.0
    p20_s: float = 0.0
    p80_s: float = 0.0
    repeats: int = 0


class CardTiming(BaseModel):
    """What a roofline needs of one stored card."""

    model_config = ConfigDict(extra="allow")

    index: int
    op: str
    kind: str
    calls: int = 0
    time_s: float = 0.0
    bytes_per_call: int = 0


class OpsetListing(ManifestBase):
    capture: str = ""
    strategy: str = ""
    device: str = "cpu"
    backward: bool = False
    module_time: ModuleTime = Field(default_factory=ModuleTime)
    # Read as CardTiming only where timings are needed: a listing only counts them.
    cards: list[Any] = Field(default_factory=list)


class OpsetEntry(BaseModel):
    ref: str = Field(description="name:vN of the opset (cards are <ref>/<index>).")
    name: str
    version: int
    tags: list[str] = Field(default_factory=list)
    capture: str = Field(description="The capture the cards were recorded from (name:vN).")
    cards: int = Field(description="Number of cards.")
    module_time_s: float = Field(description="Median plain run time of the module.")
    device: str
    backward: bool
    created_at: str


def _tags_at(repo: Repository, kind: str, name: str, version: int) -> list[str]:
    """The aliases of ``name`` that point at ``version`` (``latest`` included), sorted."""
    return sorted(tag for tag, v in repo.aliases(kind, name).items() if v == version)


def opset_entries(repo: Repository, capture: str | None = None) -> list[OpsetEntry]:
    """Every opset version, by name then version; only those recorded from ``capture`` when given
    (a capture reference, resolved first: an unknown capture is a clear error). capture_ops stores
    the opsets of a capture under the capture's name, so only that name is read then."""
    wanted = None
    names = repo.names(KIND)
    if capture:
        cap_name, cap_version = repo.resolve("captures", capture)
        wanted = f"{cap_name}:v{cap_version}"
        names = [n for n in names if n == cap_name]
    out = []
    for name in names:
        for version in repo.versions(KIND, name):
            m = repo.open(KIND, f"{name}:v{version}").manifest_as(OpsetListing)
            if wanted is not None and m.capture != wanted:
                continue
            out.append(OpsetEntry(
                ref=f"{name}:v{version}", name=name, version=version, tags=_tags_at(repo, KIND, name, version),
                capture=m.capture, cards=len(m.cards), module_time_s=m.module_time.median_s, device=m.device,
                backward=m.backward, created_at=m.created_at,
            ))
    return out


class CardRoofline(BaseModel):
    card_id: str
    op: str
    kind: str
    calls: int
    time_s: float
    bytes_per_s: float | None = Field(None, description="Achieved bandwidth (memory-bound cards with a time).")
    fraction: float | None = Field(None, description="bytes_per_s / copy_bytes_per_s; above 1 means the data sat "
                                   "in cache.")


class OpsetRooflines(BaseModel):
    opset: str
    device: str
    copy_bytes_per_s: float | None = Field(None, description="This machine's copy bandwidth on the opset's device.")
    cards: list[CardRoofline]
    notes: list[str] = Field(default_factory=list)


def card_rooflines(repo: Repository, ref: str, copy_bytes_per_s: Callable[[str], float | None]) -> OpsetRooflines:
    """The roofline of every card of the opset ``ref``. ``copy_bytes_per_s(device)`` gives the
    machine's copy bandwidth (None when it cannot be measured here, e.g. a CUDA opset on a machine
    without a GPU: then no fraction is given)."""
    art = repo.open(KIND, ref)
    m = art.manifest_as(OpsetListing)
    ceiling = copy_bytes_per_s(m.device)
    notes = [] if ceiling else [f"no copy bandwidth for device {m.device!r} on this machine: no roofline fractions"]
    cards = []
    for c in (CardTiming.model_validate(card) for card in m.cards):
        achieved = c.bytes_per_call * c.calls / c.time_s if c.kind == "memory" and c.time_s > 0 else None
        cards.append(CardRoofline(
            card_id=f"{art.ref}/{c.index}", op=c.op, kind=c.kind, calls=c.calls, time_s=c.time_s,
            bytes_per_s=achieved, fraction=achieved / ceiling if achieved is not None and ceiling else None,
        ))
    return OpsetRooflines(opset=art.ref, device=m.device, copy_bytes_per_s=ceiling, cards=cards, notes=notes)
