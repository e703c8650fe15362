"""Eager vs the best template kernel vs torch.compile, for the example block's memory-bound cards.

    python benchmarks/templates_vs_eager.py [--backend cpp] [--threads 1]

One run: capture blocks.1 of the example transformer, record its cards, and for every memory-bound
card that a template fits, validate each template variant in the sandbox (timing against eager
and torch.compile on the captured sample, interleaved) and keep the best correct one. Prints a
Markdown table of medians and ratios, and writes it to benchmarks/results/.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _measured(point: float | None, interval: list[float] | None) -> str:
    span = f" ({interval[0]:.2f}..{interval[1]:.2f})" if interval else ""
    return (f"{point:.2f}x" if point is not None else "undetermined") + span


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="cpp")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # inherited by the sandbox workers
    import torch

    torch.set_num_threads(args.threads)
    from report import publish

    from modulelens.errors import ModuleLensError
    from modulelens.kernels import templates
    from modulelens.registry import ToolContext
    from modulelens.tools.capture_module import CaptureModuleRequest, capture_module
    from modulelens.tools.capture_ops import CaptureOpsRequest, capture_ops
    from modulelens.tools.generate_kernel import GenerateKernelRequest, generate_kernel
    from modulelens.tools.validate_kernel import ValidateKernelRequest, validate_kernel

    ctx = ToolContext(repo_root=Path(tempfile.mkdtemp(prefix="ml-bench-tpl-")))
    cap = capture_module(CaptureModuleRequest(script=str(ROOT / "examples" / "tinyformer" / "train.py"),
                                              module="blocks.1", export=False, script_args=["--steps", "2"]), ctx)
    ops = capture_ops(CaptureOpsRequest(ref=cap.ref, include_views=False), ctx)
    from modulelens.ops import open_card
    from modulelens.repo import Repository

    rows = []
    for c in ops.cards:
        if c.kind != "memory" or not c.shapes:
            continue
        _, card = open_card(Repository(ctx.repo_root), c.card_id)
        try:
            n = templates.variants(card, args.backend)
        except ModuleLensError:
            n = 0
        if n == 0:  # random, in-place, copy and mask operators have no template
            continue
        best = None
        for v in range(n):
            gen = generate_kernel(GenerateKernelRequest(card=c.card_id, backend=args.backend, variant=v), ctx)
            rep = validate_kernel(ValidateKernelRequest(candidate=gen.candidate_id, compile_baseline=True, seeds=1), ctx)
            if rep.correct and rep.speedup_interval and (best is None or rep.speedup_interval[0] > best[1].speedup_interval[0]):
                best = (v, rep)  # ranked by the lower bound of the speedup interval
        if best is None:
            rows.append(f"| {c.op} | {c.shapes} | - | no correct variant | - | - | - |")
            continue
        v, rep = best
        compiled = f"{rep.compiled_baseline.median_s * 1e6:.1f}" if rep.compiled_baseline else "-"
        rows.append(
            f"| {c.op} | {c.shapes} | {rep.eager.median_s * 1e6:.1f} | {rep.candidate.median_s * 1e6:.1f} (v{v}) | "
            f"{compiled} | {_measured(rep.speedup_vs_eager, rep.speedup_interval)} | "
            f"{_measured(rep.speedup_vs_compile, rep.speedup_vs_compile_interval)} |")
    publish(f"templates_vs_eager_{args.backend}_{args.threads}t", [
        f"# eager vs best {args.backend} template vs torch.compile (torch {torch.__version__}, {args.threads} thread(s))",
        "",
        "medians in microseconds on the card's captured sample; timed in the sandbox, interleaved with eager; "
        "speedups with their 95% interval (undetermined when too wide); the best variant by the interval's low end",
        "",
        "| card op | shapes | eager us | best template us | torch.compile us | template vs eager | template vs compile |",
        "|---|---|---|---|---|---|---|",
        *rows,
    ])


if __name__ == "__main__":
    main()
