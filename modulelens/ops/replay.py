"""Run a card's operator alone on one of its stored samples and compare with the eager output."""

from __future__ import annotations

import time

from pydantic import Field

from modulelens.numerics import diff, tolerances
from modulelens.ops.cards import open_card, output_tensors, require_tensor_inputs, run_card, sample_call
from modulelens.replies import ToolReply
from modulelens.repo import Repository


class CardReplay(ToolReply):
    card_id: str
    op: str
    sample: int
    match: bool = Field(description="Every output allclose to the stored eager output.")
    exact: bool = Field(description="Every output bitwise equal to the stored eager output.")
    max_abs_error: float
    outputs: int
    run_seconds: float = Field(description="Wall time of this single call (not a benchmark; see profile).")
    synthesized_inputs: bool
    values_compared: bool = Field(description="False for operators whose output is uninitialised memory "
                                  "(empty, empty_like, ...): only shapes and dtypes are compared.")


def replay_card(repo: Repository, card_id: str, sample: int = 0) -> CardReplay:
    """One call of the card's operator on stored sample ``sample``, compared with its stored output
    (allclose at per-dtype tolerances, and bit for bit)."""
    art, card = open_card(repo, card_id)
    require_tensor_inputs(card)
    args, kwargs, expected, synthesized = sample_call(art, card, sample)
    t0 = time.perf_counter()
    out = run_card(card, args, kwargs)
    run_s = time.perf_counter() - t0
    got, want = output_tensors(out), output_tensors(expected)
    errs, ok = [], len(got) == len(want)
    values = not card.uninitialised_output
    for a, e in zip(got, want):
        if not values:
            ok = ok and a.shape == e.shape and a.dtype == e.dtype
            continue
        rtol, atol = tolerances(e.dtype)
        d = diff(a, e, rtol, atol)
        errs.append(d.max_abs_error)
        ok = ok and d.allclose
    return CardReplay(
        card_id=card.card_id, op=card.op, sample=sample, match=ok and not synthesized,
        exact=ok and not synthesized and all(e == 0.0 for e in errs), max_abs_error=max(errs, default=0.0),
        outputs=len(got), run_seconds=run_s, synthesized_inputs=bool(synthesized), values_compared=values,
    )
