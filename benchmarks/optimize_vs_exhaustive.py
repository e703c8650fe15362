"""optimize (template provider) vs trying every template variant, on the example block's cards.

    python benchmarks/optimize_vs_exhaustive.py [--backend cpp] [--threads 1] [--patience 2] [--rounds 5]

One run: capture blocks.1 of the example transformer and record its cards. For every card a
template fits:

1. exhaustive: validate every variant in the sandbox; the best is the correct one with the
   highest speedup over eager (eager and candidate timed interleaved by the same worker);
2. optimize: one tree search over the same card with a budget of one evaluation fewer than there
   are variants (and ``--patience``), so it can never try them all;
3. the two winners are then re-measured against each other on one sandbox worker, interleaved
   (``--rounds`` validations each, alternating): "at least as fast" means the search's winner's
   median speedup is not below the exhaustive winner's by more than the measurement noise (the
   larger range of either winner's speedups over the rounds); the same variant counts as equal.

Prints a Markdown table and writes it to benchmarks/results/.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="cpp")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--patience", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # inherited by the sandbox workers
    import torch

    torch.set_num_threads(args.threads)
    from report import publish

    from modulelens.kernels import load_candidate, save_candidate, templates
    from modulelens.ops import open_card, open_opset
    from modulelens.registry import ToolContext
    from modulelens.repo import Repository
    from modulelens.search.executors import LocalExecutor
    from modulelens.search.loop import run_search, start_or_resume
    from modulelens.search.model import SearchSettings
    from modulelens.search.summary import search_summary
    from modulelens.search.targets import resolve_targets
    from modulelens.tools.capture_module import CaptureModuleRequest, capture_module
    from modulelens.tools.capture_ops import CaptureOpsRequest, capture_ops
    from modulelens.validation.report import ValidationSettings
    from modulelens.validation.sandboxed import new_pool, validate_candidate

    ctx = ToolContext(repo_root=Path(tempfile.mkdtemp(prefix="ml-bench-opt-")))
    repo = Repository(ctx.repo_root)
    cap = capture_module(CaptureModuleRequest(script=str(ROOT / "examples" / "tinyformer" / "train.py"),
                                              module="blocks.1", export=False, script_args=["--steps", "2"]), ctx)
    capture_ops(CaptureOpsRequest(ref=cap.ref, include_views=False), ctx)
    _, opset = open_opset(repo, cap.ref.partition(":")[0])
    sandbox = new_pool()  # one worker for the exhaustive runs and the final comparison

    def validate(candidate_id: str, card_id: str):
        art, src = load_candidate(repo, candidate_id)
        return validate_candidate(repo, art, src, ValidationSettings(card_id=card_id, seeds=[0], min_run_time=0.2),
                                  timeout=900, sandbox=sandbox)

    rows, holds = [], []
    for card in opset.cards:
        n = templates.variants(card, args.backend)
        if n == 0:
            continue
        _, card = open_card(repo, card.card_id)
        best = None  # (speedup, variant, candidate id)
        for v in range(n):
            art = save_candidate(repo, card, templates.render(card, args.backend, v))
            rep = validate(art.ref, card.card_id)
            if rep.verdict == "custom" and rep.correct and rep.speedup_vs_eager and (best is None or rep.speedup_vs_eager > best[0]):
                best = (rep.speedup_vs_eager, v, art.ref)
        settings = SearchSettings(backend=args.backend, max_evals=max(1, n - 1), patience=args.patience)
        search, _ = start_or_resume(repo, resolve_targets(repo, [card.card_id], settings, 1), settings,
                                    executor="local", new=True)
        executor = LocalExecutor(1)
        try:
            out = run_search(repo, search, executor)
        finally:
            executor.close()
        target = out.targets[0]
        tree = search_summary(repo, out.search_id).targets[0]
        found = next((x for x in tree.nodes if x.node == target.best_node), None)
        if best is None or found is None:
            rows.append(f"| {card.card_id} | {card.op} | {n} | {out.evaluations} | - | - | - | - | no correct candidate |")
            holds.append(False)
            continue
        same = found.variant == best[1]
        opt_speedups, exh_speedups = [], []
        for _ in range(args.rounds):  # interleaved on one worker
            opt_speedups.append(validate(target.best_candidate, card.card_id).speedup_vs_eager or 0.0)
            exh_speedups.append(validate(best[2], card.card_id).speedup_vs_eager or 0.0)
        opt_med, exh_med = statistics.median(opt_speedups), statistics.median(exh_speedups)
        noise = max(max(opt_speedups) - min(opt_speedups), max(exh_speedups) - min(exh_speedups))
        ok = out.evaluations < n and (same or opt_med >= exh_med - noise)
        holds.append(ok)
        rows.append(f"| {card.card_id} | {card.op} | {n} | {out.evaluations} | v{best[1]} {exh_med:.2f}x | "
                    f"v{found.variant} {opt_med:.2f}x | {noise:.2f}x | {target.stopped_because} | {'yes' if ok else 'NO'} |")
    sandbox.close()
    publish(f"optimize_vs_exhaustive_{args.backend}_{args.threads}t", [
        f"# optimize vs every template variant ({args.backend}, torch {torch.__version__}, {args.threads} thread(s), "
        f"patience {args.patience})",
        "",
        "speedups over eager are medians of interleaved re-measurements of both winners on one sandbox worker",
        "",
        "| card | op | variants (exhaustive evals) | optimize evals | exhaustive best | optimize best | "
        "noise | search stopped | at least as fast, fewer evals |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"holds on {sum(holds)} of {len(holds)} cards",
    ])


if __name__ == "__main__":
    main()
