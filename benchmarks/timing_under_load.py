"""Speedups under load: 10 validations each of 3 C++ template kernels, quiet and under 2 busy loops per core.

    python benchmarks/timing_under_load.py [--runs 10] [--threads 1]

For softmax, layer norm and GELU cards (captured here from small modules), validate the first cpp
template variant ``--runs`` times with nothing else started, then as often with two spinning
processes per core (started here, stopped at the end). Prints a Markdown table of the reported
speedups (or "undet." with the interval) per condition, the share determined, their spread around
their median, and how many loaded figures fall outside 2x of the quiet median; writes it to
benchmarks/results/. Goal: quiet, at least 9/10 determined and within 15% of their median; loaded,
none outside 2x. "Quiet" means only that this script started no load: the 1-minute load average
at the start of each condition is printed with it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OPS = {"aten._softmax.default": "softmax [64, 1024]", "aten.native_layer_norm.default": "layer norm [64, 1024]",
       "aten.gelu.default": "gelu [64, 4096]"}


def _cards(ctx) -> dict[str, str]:
    import torch

    import modulelens
    from modulelens.tools.capture_ops import CaptureOpsRequest, capture_ops

    modules = {"sm": (lambda: torch.nn.Softmax(dim=-1), (64, 1024)), "ln": (lambda: torch.nn.LayerNorm(1024), (64, 1024)),
               "gelu": (lambda: torch.nn.GELU(), (64, 4096))}
    cards = {}
    for name, (build, shape) in modules.items():
        with modulelens.capture("", name=name, repo=ctx.repo_root, export=False):  # built inside: replayable
            build()(torch.randn(*shape))
        ops = capture_ops(CaptureOpsRequest(ref=name, repeats=3), ctx)
        cards.update({c.op: c.card_id for c in ops.cards if c.op in OPS})
    return cards


def _busy(count: int, seconds: float) -> list[subprocess.Popen]:
    code = f"import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(count)]


def _cell(r) -> str:
    if r.timing_status == "ok":
        return f"{r.speedup_vs_eager:.2f}x"
    if r.speedup_interval:
        return f"undet. ({r.speedup_interval[0]:.2f}..{r.speedup_interval[1]:.2f})"
    return "undet."


def _summary(figures: list[float], runs: int) -> tuple[str, str]:
    if not figures:
        return f"0/{runs}", "-"
    med = statistics.median(figures)
    spread = max(abs(x / med - 1) for x in figures)
    return f"{len(figures)}/{runs}", f"median {med:.2f}x, all within {spread:.0%}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # inherited by the sandbox workers
    sys.path.insert(0, str(ROOT))
    import torch
    from report import publish

    from modulelens.registry import ToolContext
    from modulelens.timing.noise import machine_load, usable_cores
    from modulelens.tools.generate_kernel import GenerateKernelRequest, generate_kernel
    from modulelens.tools.validate_kernel import ValidateKernelRequest, validate_kernel

    ctx = ToolContext(repo_root=Path(tempfile.mkdtemp(prefix="ml-bench-load-")))
    cards = _cards(ctx)
    cands = {op: generate_kernel(GenerateKernelRequest(card=cards[op], backend="cpp"), ctx).candidate_id for op in OPS}
    for op in OPS:  # build once, outside the measured runs
        validate_kernel(ValidateKernelRequest(candidate=cands[op], seeds=1, time=False), ctx)

    results: dict[tuple[str, str], list] = {}
    loads: dict[str, float] = {}
    cores = usable_cores()
    for condition in ("quiet", "loaded"):
        loops = _busy(2 * cores, 3600) if condition == "loaded" else []
        try:
            time.sleep(2 if loops else 0)
            loads[condition] = machine_load()[0]
            for op in OPS:
                results[(op, condition)] = [validate_kernel(ValidateKernelRequest(candidate=cands[op], seeds=1), ctx)
                                            for _ in range(args.runs)]
                print(op, condition, [_cell(r) for r in results[(op, condition)]], flush=True)
        finally:
            for p in loops:
                p.kill()
                p.wait()

    lines = [f"# Speedups under load (torch {torch.__version__}, {args.threads} thread(s) asked, {cores} cores)", "",
             f"{args.runs} validations per kernel and condition; loaded = {2 * cores} busy loops started here; "
             f"1-minute load average at the start: quiet {loads['quiet']:.1f}, loaded {loads['loaded']:.1f}", "",
             "| kernel | condition | reported speedups | determined | spread of determined | outside 2x of quiet |",
             "|---|---|---|---|---|---|"]
    for op, label in OPS.items():
        quiet_figs = [r.speedup_vs_eager for r in results[(op, "quiet")] if r.timing_status == "ok"]
        quiet_med = statistics.median(quiet_figs) if quiet_figs else None
        for condition in ("quiet", "loaded"):
            rs = results[(op, condition)]
            figs = [r.speedup_vs_eager for r in rs if r.timing_status == "ok"]
            share, spread = _summary(figs, len(rs))
            outside = "-" if quiet_med is None else str(sum(not (quiet_med / 2 <= x <= 2 * quiet_med) for x in figs))
            lines.append(f"| {label} | {condition} | {', '.join(_cell(r) for r in rs)} | {share} | {spread} | "
                         f"{outside if condition == 'loaded' else '-'} |")
    lines += ["", "Goal: quiet, >= 9/10 determined and within 15% of their median; loaded, 0 outside 2x."]
    publish(f"timing_under_load_{args.threads}t", lines)


if __name__ == "__main__":
    main()
