"""Operator cards in the repository: open one by id, decode its stored sample calls, run its op.

The records themselves (opset manifest, card, sample) and card ids are in :mod:`modulelens.ops.model`.
"""

from __future__ import annotations

from typing import Any

import torch

from modulelens.capture import Decoder, Resolver, TensorSource, flatten, load_tensors
from modulelens.errors import ModuleLensError, ReferenceNotFound
from modulelens.ops.model import KIND, SAMPLES_FILE, OpCard, OpSetManifest, format_card_id, parse_card_id
from modulelens.ops.recorder import resolve_op
from modulelens.repo import Artifact, Repository, require_trusted


def open_opset(repo: Repository, ref: str) -> tuple[Artifact, OpSetManifest]:
    """The opset artifact ``ref`` resolves to (``blk``, ``blk:v2``, ``blk@tag``) and its manifest."""
    art = repo.open(KIND, ref)
    return art, art.manifest_as(OpSetManifest)


def resolved_card_id(repo: Repository, card_id: str) -> str:
    """``card_id`` with its opset reference resolved (``blk/6`` gives ``blk:v2/6``, the id cards are
    stored under); a clear error for an unknown opset."""
    ref, index = parse_card_id(card_id)
    name, version = repo.resolve(KIND, ref)
    return format_card_id(f"{name}:v{version}", index)


def open_card(repo: Repository, card_id: str) -> tuple[Artifact, OpCard]:
    """The opset artifact holding ``card_id`` and the card (whose ``card_id`` is then resolved:
    ``blk/0`` comes back as ``blk:v3/0``)."""
    ref, index = parse_card_id(card_id)
    art, opset = open_opset(repo, ref)
    return art, opset.card(index)


def sample_call(art: Artifact, card: OpCard, sample: int = 0, device: str | None = None) -> tuple[list, dict, Any, list[str]]:
    """Decoded (args, kwargs, expected_output, synthesized keys) of one stored sample. For random
    operators the CPU RNG is set to the state it had before the recorded call."""
    if sample >= len(card.samples):
        raise ReferenceNotFound(f"card {card.card_id} has no sample {sample}", f"it has {len(card.samples)} sample(s)")
    require_trusted(art, "decode its samples")  # decoding resolves the class paths it names
    s = card.samples[sample]
    tensors = load_tensors(art, SAMPLES_FILE)
    src_in = TensorSource(tensors, device=device)
    dec = Decoder(src_in, Resolver())
    args, kwargs = dec.decode(s.args), dec.decode(s.kwargs)
    expected = Decoder(TensorSource(tensors, device="cpu"), Resolver()).decode(s.output)
    if s.rng:
        torch.random.set_rng_state(tensors[s.rng])
    return list(args), dict(kwargs), expected, src_in.synthesized


def run_card(card: OpCard, args: list, kwargs: dict) -> Any:
    """One eager call of the card's operator."""
    return resolve_op(card.op)(*args, **kwargs)


def require_tensor_inputs(card: OpCard) -> None:
    """Raise a clear error for cards whose operator takes no tensor (nothing to time or optimise)."""
    if not card.shapes:
        raise ModuleLensError(
            f"card {card.card_id} ({card.op}) takes no tensor inputs",
            "operators that only create tensors from scalars (factories like arange or full) have nothing "
            "to optimise or time against data; pick another card",
        )


def output_tensors(value: Any) -> list[torch.Tensor]:
    """The tensors of a (decoded) operator output, in order."""
    return [x for x in flatten(value) if isinstance(x, torch.Tensor)]
