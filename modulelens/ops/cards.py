"""Operator cards in the repository.

One ``capture_ops`` run writes an *opset* artifact (kind ``opsets``, named like the capture) whose
manifest lists the cards ranked by time share, with their sample calls in ``samples.safetensors``.
A card is addressed as ``<opset ref>/<index>``: ``blk/0`` (latest opset of ``blk``, first card),
``blk:v2/3``, ``blk@prod/1``.
"""

from __future__ import annotations

from typing import Any

import torch

from modulelens.capture.artifact import load_tensors
from modulelens.capture.sources import Resolver
from modulelens.capture.values import Decoder, TensorSource
from modulelens.errors import ModuleLensError, ReferenceNotFound
from modulelens.ops.recorder import resolve_op
from modulelens.repo import Artifact, Repository

KIND = "opsets"


def parse_card_id(card_id: str) -> tuple[str, int]:
    ref, sep, index = card_id.strip().rpartition("/")
    if not sep or not ref or not index.isdigit():
        raise ModuleLensError(
            f"invalid card id {card_id!r}",
            "card ids look like 'blk/0' (latest opset of blk) or 'blk:v2/3'; list them with list-op-cards",
        )
    return ref, int(index)


def is_card_id(text: str) -> bool:
    return "/" in text and text.rpartition("/")[2].isdigit()


def open_card(repo: Repository, card_id: str) -> tuple[Artifact, dict[str, Any]]:
    ref, index = parse_card_id(card_id)
    art = repo.open(KIND, ref)
    cards = art.manifest["cards"]
    if index >= len(cards):
        raise ReferenceNotFound(
            f"opset {art.ref} has no card {index}",
            f"it has cards 0 to {len(cards) - 1}; list them with list-op-cards {art.ref}",
        )
    return art, cards[index]


def sample_call(art: Artifact, card: dict[str, Any], sample: int = 0, device: str | None = None) -> tuple[list, dict, Any, list[str]]:
    """Decoded (args, kwargs, expected_output, synthesized keys) of one stored sample. For random
    operators the CPU RNG is set to the state it had before the recorded call."""
    samples = card["samples"]
    if sample >= len(samples):
        raise ReferenceNotFound(f"card {card['card_id']} has no sample {sample}", f"it has {len(samples)} sample(s)")
    s = samples[sample]
    tensors = load_tensors(art, "samples.safetensors")
    src_in = TensorSource(tensors, device=device)
    dec = Decoder(src_in, Resolver())
    args, kwargs = dec.decode(s["args"]), dec.decode(s["kwargs"])
    expected = Decoder(TensorSource(tensors, device="cpu"), Resolver()).decode(s["output"])
    if s.get("rng"):
        torch.random.set_rng_state(tensors[s["rng"]])
    return list(args), dict(kwargs), expected, src_in.synthesized


def run_card(card: dict[str, Any], args: list, kwargs: dict) -> Any:
    return resolve_op(card["op"])(*args, **kwargs)


def require_tensor_inputs(card: dict[str, Any]) -> None:
    if not card["shapes"]:
        raise ModuleLensError(
            f"card {card['card_id']} ({card['op']}) takes no tensor inputs",
            "operators that only create tensors from scalars (factories like arange or full) have nothing "
            "to optimise or time against data; pick another card",
        )


def output_tensors(value: Any) -> list[torch.Tensor]:
    from modulelens.capture.values import flatten

    return [x for x in flatten(value) if isinstance(x, torch.Tensor)]


def card_summary_fields(card: dict[str, Any]) -> dict[str, Any]:
    return {k: card[k] for k in ("card_id", "op", "kind", "phase", "shapes", "dtypes", "strides", "contiguous",
                                 "device", "args", "calls", "time_s", "time_share", "bytes_per_call")}

