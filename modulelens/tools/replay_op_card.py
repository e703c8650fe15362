"""replay_op_card: run a card's operator alone on its stored sample and compare with the eager output."""

from __future__ import annotations

import time

from pydantic import BaseModel, Field

from modulelens.numerics import diff, tolerances
from modulelens.ops.cards import open_card, output_tensors, require_tensor_inputs, run_card, sample_call
from modulelens.registry import Tool, ToolContext, register
from modulelens.repo import Repository


class ReplayOpCardRequest(BaseModel):
    card: str = Field(description="Card id: <opset>/<index>.", json_schema_extra={"cli": "argument"})
    sample: int = Field(0, ge=0, description="Which stored sample call to replay.")


class ReplayOpCardResult(BaseModel):
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


def replay_op_card(req: ReplayOpCardRequest, ctx: ToolContext) -> ReplayOpCardResult:
    art, card = open_card(Repository(ctx.repo_root), req.card)
    card_id = f"{art.ref}/{card['index']}"
    card = {**card, "card_id": card_id}
    require_tensor_inputs(card)
    args, kwargs, expected, synthesized = sample_call(art, card, req.sample)
    t0 = time.perf_counter()
    out = run_card(card, args, kwargs)
    run_s = time.perf_counter() - t0
    got, want = output_tensors(out), output_tensors(expected)
    errs, ok = [], len(got) == len(want)
    values = not card.get("uninitialised_output", False)
    for a, e in zip(got, want):
        if not values:
            ok = ok and a.shape == e.shape and a.dtype == e.dtype
            continue
        rtol, atol = tolerances(e.dtype)
        d = diff(a, e, rtol, atol)
        errs.append(d.max_abs_error)
        ok = ok and d.allclose
    return ReplayOpCardResult(
        card_id=card_id, op=card["op"], sample=req.sample, match=ok and not synthesized,
        exact=ok and not synthesized and all(e == 0.0 for e in errs), max_abs_error=max(errs, default=0.0),
        outputs=len(got), run_seconds=run_s, synthesized_inputs=bool(synthesized), values_compared=values,
    )


TOOL = register(
    Tool(
        name="replay_op_card",
        request=ReplayOpCardRequest,
        result=ReplayOpCardResult,
        fn=replay_op_card,
        summary="Run an operator card's op alone on a stored sample and compare with its stored eager output.",
        render=lambda r: (f"{r.card_id} {r.op} sample {r.sample}: "
                          + ("exact match" if r.exact else "match" if r.match else "MISMATCH")
                          + f" (max abs error {r.max_abs_error:g}, {r.outputs} output(s))"),
    )
)
