"""Packs on real model code: tiny random-initialised transformers GPT-2 and Llama, trained by a script
whose sequence length changes from step to step (examples/transformers_tiny/train.py).

    python benchmarks/pack_real_model.py [--models gpt2,llama] [--max-evals 8] [--top 4] [--force]

For each model, in a temporary repository, the way a user does it:

1. ``capture_ops`` of the first block (``transformer.h.0`` / ``model.layers.0``) with gradients,
   captured at sequence length 32;
2. ``optimize`` that capture with the C++ templates (its top cards, forward and backward, by time
   share and headroom; and the module level, which for a whole block finds no template);
3. ``pack`` the winners (``--force``: also the ones not proven faster, to see them used);
4. ``run`` the training script with the pack and without (``--compare``) at lengths 32, 48, 24,
   40 (only 32 was captured: the other lengths reach the entries through their shape rules).

The table: per entry, the operator, its phase, its shape rule, whether the pack uses it, its hits
per phase, and its misses by reason (the two most frequent); per model, whether the losses of the
two runs are equal and the step-time ratio. The ratio is the plain ratio of median step times (no
interval: the timing helper's interval API is not on main yet), measured on whatever machine this
runs on: on a shared, loaded machine it is noise, and the script says so. Prints Markdown and
writes it to benchmarks/results/pack_real_model.md.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import platform
import tempfile
from pathlib import Path

import torch

import modulelens as ml

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ROOT / "examples" / "transformers_tiny" / "train.py"
BLOCK = {"gpt2": "transformer.h.0", "llama": "model.layers.0"}
CAPTURED_LENGTH = 32
RUN_LENGTHS = "32,48,24,40"


def _reasons(reasons: dict[str, int], n: int = 2) -> str:
    return "; ".join(f"{why} ({count})" for why, count in list(reasons.items())[:n]) or "-"


def bench_model(model: str, repo: Path, args: argparse.Namespace) -> tuple[list[str], str]:
    """(table rows of the entries, the model's summary line)."""
    common = ["--model", model, "--dim", str(args.dim), "--layers", str(args.layers)]
    ops = ml.capture_ops(str(TRAIN), [*common, "--steps", "1", "--lengths", str(CAPTURED_LENGTH)],
                         module=BLOCK[model], backward=True, top=100, repo=str(repo))
    search = ml.optimize([ops.capture], provider="template", backend="cpp", max_evals=args.max_evals, top=args.top,
                         repo=str(repo))
    print(f"{model}: optimize {search.search_id}: {search.evaluations} evaluations, winners {search.pack_candidates}; "
          f"module level: {search.modules[0].template_note if search.modules else '-'}", flush=True)
    if not search.pack_candidates:
        return [], f"{model}: no winner to pack ({search.stopped_because})"
    packed = ml.pack(search.pack_candidates, force=args.force, repo=str(repo))
    run = ml.run(str(TRAIN), [*common, "--steps", str(args.steps), "--lengths", RUN_LENGTHS], pack=packed.ref,
                 compare=True, limit=100, repo=str(repo))
    info = {e.candidate_id: e for e in packed.entries}
    rows = []
    for e in run.entries:
        p = info[e.candidate_id]
        phases = ", ".join(f"{k} {v}" for k, v in sorted(e.hits_by_phase.items(), reverse=True)) or "0"
        rows.append(f"| {model} | {e.candidate_id} | `{p.target}` | {p.phase} | {p.shape_rule or 'exact shapes'} | "
                    f"{'yes' if e.dispatched else 'no: ' + (e.skip_reason or '')} | {phases} | {e.fallbacks} | "
                    f"{_reasons(e.fallback_reasons)} |")
    ratio = (f"{run.step_seconds_without / run.step_seconds_with:.3f} (plain ratio of median step times, no interval)"
             if run.step_seconds_with and run.step_seconds_without else "-")
    summary = (f"{model}: {run.summary}; losses {'equal' if run.outputs_match else 'DIFFERENT'} "
               f"(max difference {run.max_output_difference}); step time without / with the pack: {ratio}")
    return rows, summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="gpt2,llama")
    ap.add_argument("--max-evals", type=int, default=8)
    ap.add_argument("--top", type=int, default=4)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--force", action="store_true", help="pack the winners even when not proven faster")
    args = ap.parse_args()
    rows, summaries = [], []
    for model in args.models.split(","):
        with tempfile.TemporaryDirectory(prefix=f"modulelens-real-{model}-") as tmp:
            r, s = bench_model(model, Path(tmp), args)
        rows += r
        summaries.append(s)
    table = "\n".join([
        f"Packs on tiny transformers models ({_dt.date.today()}, torch {torch.__version__}, "
        f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} thread(s); block captured at length "
        f"{CAPTURED_LENGTH}, trained at {RUN_LENGTHS}, {args.steps} steps; pack {'--force' if args.force else 'as decided'})",
        "",
        "| model | entry | operator | phase | shape rule | used | hits | misses | misses by reason |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        *rows,
        "",
        *[f"- {s}" for s in summaries],
        "",
        "Step ratios come from one run each on this machine; on a shared or loaded machine they are noise.",
    ])
    print(table)
    out = ROOT / "benchmarks" / "results" / "pack_real_model.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(table + "\n")


if __name__ == "__main__":
    main()
