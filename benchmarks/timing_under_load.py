"""Speedups under load: validations of C++ template kernels, quiet and under a heavy load.

    python benchmarks/timing_under_load.py [--runs 10] [--threads 1] [--setting heavy|busy] [--quick]

For softmax and layer-norm cards (captured here from small modules; ``--ops`` adds GELU), validate
the first cpp template variant ``--runs`` times with nothing else started ("quiet"), then as often
under load started here and stopped at the end:

* ``heavy`` (default): 8 busy loops and one memory-bandwidth hog (a 2x256 MiB copy loop), as many
  as the issue's acceptance asks on a 2-core machine, whatever the core count;
* ``busy``: two busy loops per usable core (the earlier setting).

Prints a Markdown table per kernel: the quiet figure (median of the quiet determined speedups),
the loaded figures, how many loaded validations were determined within 15% of the quiet figure,
how many fall outside 2x of it, and which clock decided (wall time, or the CPU time of each side's
process tree when the wall rounds were descheduled); writes it to benchmarks/results/.
Goal (issue 37): loaded, at least 8 of 10 determined within 15% of the quiet figure, 0 outside 2x,
the rest undetermined. ``--quick``: 2 runs of softmax only (a smoke run on a shared machine, not the
figure). "Quiet" means only that this script started no load: the 1-minute load average at the
start of each condition is printed with it.
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
BUSY = "import time\nend = time.monotonic() + {s}\nwhile time.monotonic() < end:\n    pass\n"
BANDWIDTH_HOG = ("import time\nimport numpy as np\na = np.ones(32 << 20)\nb = np.empty_like(a)\n"
                 "end = time.monotonic() + {s}\nwhile time.monotonic() < end:\n    np.copyto(b, a)\n    np.copyto(a, b)\n")


def _cards(ctx, ops: list[str]) -> dict[str, str]:
    import torch

    import modulelens
    from modulelens.tools.capture_ops import CaptureOpsRequest, capture_ops

    modules = {"aten._softmax.default": ("sm", lambda: torch.nn.Softmax(dim=-1), (64, 1024)),
               "aten.native_layer_norm.default": ("ln", lambda: torch.nn.LayerNorm(1024), (64, 1024)),
               "aten.gelu.default": ("gelu", lambda: torch.nn.GELU(), (64, 4096))}
    cards = {}
    for op in ops:
        name, build, shape = modules[op]
        with modulelens.capture("", name=name, repo=ctx.repo_root, export=False):  # built inside: replayable
            build()(torch.randn(*shape))
        found = capture_ops(CaptureOpsRequest(ref=name, repeats=3), ctx)
        cards.update({c.op: c.card_id for c in found.cards if c.op == op})
    return cards


def _load(setting: str, cores: int, seconds: float) -> list[subprocess.Popen]:
    """The processes of a load setting (killed by the caller)."""
    if setting == "heavy":
        codes = [BUSY.format(s=seconds)] * 8 + [BANDWIDTH_HOG.format(s=seconds)]
    else:
        codes = [BUSY.format(s=seconds)] * (2 * cores)
    return [subprocess.Popen([sys.executable, "-c", code]) for code in codes]


def _clock(r) -> str:
    m = r.measurement
    return getattr(m, "clock", "wall") if m is not None else "-"


def _cell(r) -> str:
    if r.timing_status == "ok":
        return f"{r.speedup_vs_eager:.2f}x ({_clock(r)})"
    if r.speedup_interval:
        return f"undet. ({r.speedup_interval[0]:.2f}..{r.speedup_interval[1]:.2f})"
    return "undet."


def _row(label: str, condition: str, rs: list, quiet: float | None) -> str:
    figs = [r.speedup_vs_eager for r in rs if r.timing_status == "ok"]
    clocks = [_clock(r) for r in rs if r.timing_status == "ok"]
    clock = ", ".join(f"{clocks.count(c)} {c}" for c in ("wall", "cpu") if c in clocks) or "-"
    if quiet is None:
        within = outside = "-"
    else:
        within = f"{sum(abs(x / quiet - 1) <= 0.15 for x in figs)}/{len(rs)}"
        outside = str(sum(not (quiet / 2 <= x <= 2 * quiet) for x in figs))
    shown = f"{quiet:.2f}x" if quiet is not None else "-"
    return (f"| {label} | {condition} | {shown} | {', '.join(_cell(r) for r in rs)} | {len(figs)}/{len(rs)} | "
            f"{within} | {outside} | {clock} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--setting", choices=["heavy", "busy"], default="heavy")
    ap.add_argument("--ops", default="aten._softmax.default,aten.native_layer_norm.default",
                    help=f"comma-separated, from {', '.join(OPS)}")
    ap.add_argument("--quick", action="store_true", help="2 runs of softmax only (a smoke run, not the figure)")
    args = ap.parse_args()
    ops = ["aten._softmax.default"] if args.quick else [o for o in args.ops.split(",") if o]
    runs = 2 if args.quick else args.runs
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # inherited by the sandbox workers
    sys.path.insert(0, str(ROOT))
    import torch
    from report import publish

    from modulelens.registry import ToolContext
    from modulelens.timing.noise import machine_load, usable_cores
    from modulelens.tools.generate_kernel import GenerateKernelRequest, generate_kernel
    from modulelens.tools.validate_kernel import ValidateKernelRequest, validate_kernel

    ctx = ToolContext(repo_root=Path(tempfile.mkdtemp(prefix="ml-bench-load-")))
    cards = _cards(ctx, ops)
    cands = {op: generate_kernel(GenerateKernelRequest(card=cards[op], backend="cpp"), ctx).candidate_id for op in ops}
    for op in ops:  # build once, outside the measured runs
        validate_kernel(ValidateKernelRequest(candidate=cands[op], seeds=1, time=False), ctx)

    results: dict[tuple[str, str], list] = {}
    loads: dict[str, float] = {}
    cores = usable_cores()
    loaded = f"loaded ({args.setting})"
    for condition in ("quiet", loaded):
        procs = _load(args.setting, cores, 3600) if condition != "quiet" else []
        try:
            time.sleep(2 if procs else 0)
            loads[condition] = machine_load()[0]
            for op in ops:
                results[(op, condition)] = [validate_kernel(ValidateKernelRequest(candidate=cands[op], seeds=1), ctx)
                                            for _ in range(runs)]
                print(op, condition, [_cell(r) for r in results[(op, condition)]], flush=True)
        finally:
            for p in procs:
                p.kill()
                p.wait()

    what = ("8 busy loops and one memory-bandwidth hog (2x256 MiB copies)" if args.setting == "heavy"
            else f"{2 * cores} busy loops")
    lines = [f"# Speedups under load (torch {torch.__version__}, {args.threads} thread(s) asked, {cores} cores"
             f"{', --quick' if args.quick else ''})", "",
             f"{runs} validations per kernel and condition; loaded = {what} started here; "
             f"1-minute load average at the start: quiet {loads['quiet']:.1f}, loaded {loads[loaded]:.1f}", "",
             "| kernel | condition | quiet figure | reported speedups (clock) | determined | within 15% of quiet | "
             "outside 2x of quiet | deciding clock |",
             "|---|---|---|---|---|---|---|---|"]
    for op in ops:
        quiet_figs = [r.speedup_vs_eager for r in results[(op, "quiet")] if r.timing_status == "ok"]
        quiet = statistics.median(quiet_figs) if quiet_figs else None
        for condition in ("quiet", loaded):
            lines.append(_row(OPS[op], condition, results[(op, condition)], quiet))
    lines += ["", "Goal (issue 37): loaded, >= 8/10 determined within 15% of the quiet figure, 0 outside 2x, "
              "the rest undetermined."]
    publish(f"timing_under_load_{args.setting}_{args.threads}t{'_quick' if args.quick else ''}", lines)


if __name__ == "__main__":
    main()
