"""The fusing module template against what users would pick instead: eager and torch.compile.

    python benchmarks/fusion_real_models.py [--threads 1] [--quick] [--no-train]

Blocks: the example's TinyFormer block (dim 64, 4 heads, dropout 0.1, [8, 32, 64]), a tiny
random-initialised transformers GPT-2 block (``GPT2Block``, sdpa attention) and a tiny Llama
decoder layer (``LlamaDecoderLayer``; it takes rotary position embeddings as a second input, which
the template does not take: its MLP is measured instead, and the table says why). For each block,
in one run: the fused template's ModelNew is built and checked against eager (outputs and
gradients, training mode with the same RNG state), then eager (the base), ``torch.compile``
(default mode) and the fused template are timed together in interleaved rounds
(:func:`modulelens.timing.measure_speedups`), forward only and forward+backward: each ratio is
eager time / side time with its 95% interval.

Training step (skipped with ``--no-train``): the example's training script captured at
``blocks.1``, the fused template validated against the capture (sandboxed, training claimed,
timed), packed, and the unmodified script run with the pack against eager
(``modulelens run --compare``): the step ratio with its interval and whether losses match.

``--quick``: shorter timing budgets and fewer training steps (numbers with wide intervals; for
checking the script runs). Prints a Markdown table and writes it to benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))


def _blocks():
    """(name, module, input) of each block measured."""
    import torch
    from transformers import GPT2Config, LlamaConfig
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    sys.path.insert(0, str(ROOT / "examples" / "tinyformer"))
    import model

    torch.manual_seed(0)
    x = torch.randn(8, 32, 64)
    gcfg = GPT2Config(n_embd=64, n_head=4, n_layer=1)
    gcfg._attn_implementation = "sdpa"
    lcfg = LlamaConfig(hidden_size=64, intermediate_size=172, num_attention_heads=4, num_key_value_heads=4)
    llama = LlamaDecoderLayer(lcfg, 0)
    return [("example block", model.Block(model.TinyConfig(), 1), x),
            ("tiny GPT-2 block", GPT2Block(gcfg, 0), x),
            ("tiny Llama layer", llama, x),
            ("tiny Llama MLP", llama.mlp, x)]


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def _check(module, fused, x) -> str:
    """Max abs difference of outputs and input gradients in training mode, same RNG state."""
    import torch

    module.train(), fused.train()
    xs = [x.clone().requires_grad_() for _ in range(2)]  # leaves: their .grad is filled
    outs = []
    for m, xi in zip((module, fused), xs):
        torch.manual_seed(3)
        y = _first(m(xi))
        y.pow(2).sum().backward()
        outs.append(y)
    with torch.no_grad():
        return (f"max difference: out {float((outs[0] - outs[1]).abs().max()):.1e}, "
                f"input grad {float((xs[0].grad - xs[1].grad).abs().max()):.1e}")


def _measured(m) -> str:
    if m.speedup is None:
        rng = f" (rounds {m.ratio_range[0]:.2f}..{m.ratio_range[1]:.2f})" if m.ratio_range else ""
        return "undetermined" + rng
    span = f" ({m.interval[0]:.2f}..{m.interval[1]:.2f})" if m.interval else ""
    return f"{m.speedup:.2f}x{span}"


def _micro(args) -> list[str]:
    import torch

    from modulelens.kernels import NotFusable, fusion_plan, load_class, render_fused
    from modulelens.timing import CallableSide, ThreadChoice, TimingPlan, measure_speedups

    plan_t = TimingPlan(budget_s=2.0 if args.quick else 8.0, min_seconds=0.2 if args.quick else 0.5)
    threads = ThreadChoice(threads=args.threads, why="--threads")
    rows = []
    for name, module, x in _blocks():
        try:
            plan = fusion_plan(module, [x], {})
        except NotFusable as e:
            rows.append(f"| {name} | not fused: {e} | - | - | - | - |")
            print(rows[-1], flush=True)
            continue
        fused = load_class(render_fused(plan))()
        fused.load_state_dict(module.state_dict())
        check = _check(module, fused, x)
        compiled = torch.compile(module)
        results = {}
        for mode in ("forward", "forward+backward"):
            for m in (module, fused):
                m.train(mode != "forward")
            xg = x.clone().requires_grad_(mode != "forward")

            def call(m, mode=mode, xg=xg):
                if mode == "forward":
                    with torch.no_grad():
                        return _first(m(xg))
                torch.manual_seed(0)
                y = _first(m(xg))
                y.sum().backward()
                return y

            sides = [CallableSide(f"{mode} {label}", lambda m=m: call(m))
                     for label, m in (("eager", module), ("compile", compiled), ("fused", fused))]
            for s in sides:  # compile (and warm) before timing
                s.fn()
                s.fn()
            results[mode] = measure_speedups(sides[0], sides[1:], plan_t, threads)
        f, fb = results["forward"], results["forward+backward"]
        rows.append(f"| {name} | {plan.summary()} ({check}) | {_measured(f[0])} | {_measured(f[1])} | "
                    f"{_measured(fb[0])} | {_measured(fb[1])} |")
        print(rows[-1], flush=True)
    return rows


def _cli(home: Path, *argv: str) -> dict:
    env = {**os.environ, "MODULELENS_HOME": str(home)}
    out = subprocess.run([sys.executable, "-m", "modulelens", argv[0], "--json", *argv[1:]], cwd=ROOT, env=env,
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"modulelens {' '.join(argv)} failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout)


def _training(args) -> list[str]:
    """The example's training script with the fused block packed, against eager."""
    from modulelens.capture import KIND, LoadedCapture
    from modulelens.kernels import fusion_plan, render_fused
    from modulelens.repo import Repository

    home = Path(tempfile.mkdtemp(prefix="ml-bench-fusion-"))
    script = "examples/tinyformer/train.py"
    _cli(home, "capture-module", script, "--module", "blocks.1", "--name", "bench-block", "--backward", "--",
         "--steps", "1")
    loaded = LoadedCapture(Repository(home).open(KIND, "bench-block"))
    module, _, _, _ = loaded.with_strategy("auto", False, lambda m: m)
    a, k = loaded.inputs()
    source = home / "fused_block.py"
    source.write_text(render_fused(fusion_plan(module, a, k)))
    rep = _cli(home, "validate-kernel", "--source", str(source), "--target", "bench-block", "--claims-training")
    pack = home / "fused.pack"
    _cli(home, "pack", rep["candidate_id"], "--out", str(pack), "--force")
    steps = "10" if args.quick else "40"
    run = _cli(home, "run", script, "--pack", str(pack), "--compare", "--", "--steps", steps)
    ratio, span = run.get("step_ratio"), run.get("step_ratio_interval")
    return [f"- validation: {rep['verdict']}, module speedup {rep.get('speedup_vs_eager')} "
            f"{rep.get('speedup_interval')}: {rep['reason'][:300]}",
            f"- training step ratio (eager / packed, {steps} steps): "
            + (f"{ratio:.2f}x" if ratio else "undetermined") + (f" ({span[0]:.2f}..{span[1]:.2f})" if span else "")
            + f"; {run.get('timing_reason', '')}",
            f"- hits {run.get('hits')} {run.get('hits_by_phase')}, losses match: {run.get('outputs_match')} "
            f"(max difference {run.get('max_output_difference')})"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="short timing budgets, few training steps")
    ap.add_argument("--no-train", action="store_true", help="only the per-block timings")
    args = ap.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import torch

    torch.set_num_threads(args.threads)
    from report import publish

    from modulelens.timing.noise import machine_load

    load, cores = machine_load()
    lines = [f"# fused template vs eager and torch.compile (torch {torch.__version__}, {args.threads} thread(s), "
             f"load {load:.1f} on {cores} cores{', --quick' if args.quick else ''})", "",
             "Ratios: eager time / side time, median of interleaved rounds (95% interval).", "",
             "| block | fused | fwd: compile | fwd: fused | fwd+bwd: compile | fwd+bwd: fused |",
             "|---|---|---|---|---|---|", *_micro(args)]
    print("\n".join(lines), flush=True)
    if not args.no_train:
        try:
            train = _training(args)
        except RuntimeError as e:  # the table above still stands
            train = [f"- failed: {e}"]
        lines += ["", "## training step, example script, fused block packed", "", *train]
    publish(f"fusion_real_models_{args.threads}t{'_quick' if args.quick else ''}", lines)


if __name__ == "__main__":
    main()
