"""Training-step overhead of gather-stats, as ratios with 95% intervals, measured in one run.

    python benchmarks/stats_overhead.py [--model mlp,tinyformer] [--rounds 16] [--block-steps 10] [--threads 1]
                                        [--clock wall|cpu] [--floor]

Three ways of training the same model run interleaved in rounds: without statistics, with
statistics on every step (``every=1``: every step is a sampled step) and with statistics every 10th
step (the default). In each round every way runs one block of ``--block-steps`` training steps (a
multiple of 10), in an order that rotates from round to round, so that drift and background load
hit all ways alike. Per round:

- **every step**: median step time of the every-step block / median step time of the plain block:
  what one sampled step costs against a plain one;
- **every 10th**: mean step time of the every-10 block / mean step time of the plain block: the
  overhead a training run sees with the default;
- **sampled / plain in the same block**: the sampled step of each every-10 block against the median
  of that block's other steps (the same figure as "every step", measured without leaving the block).

The table gives the median over rounds and a 95% interval from a bootstrap over rounds (rounds
drawn with replacement, 2,000 times; the 2.5th and 97.5th percentiles of the median). A step's time
includes the sampled step's hook work and the end-of-step transfer of the statistics; not the
one-time fx trace or saving at the end of a run (``fx=False``, nothing is stored).

``--clock cpu`` times steps with the CPU time of the training thread (``time.thread_time``) instead
of the wall clock: with one thread all the work of a step runs on it, and time the process spends
waiting for a core on a loaded machine is left out, so ratios vary far less between runs there.
``--floor`` adds a fourth way, the least any per-module statistics can cost: global module hooks
and gradient hooks on every module output that compute only the one-pass moments of each output
and output gradient (the C helper), nothing else (no input norms, parameters, softmax or
bookkeeping); its "every step" ratio is a lower bound for the collector's.

Models: ``mlp`` (8 Linear+ReLU(inplace) layers of width 1024, batch 256), ``wide`` (4 layers of
width 2048) and ``tinyformer`` (examples/tinyformer, 4 layers of width 64, batch 8x64: 55 small
modules, the worst case for per-module cost). One thread by default (``--threads``): on a shared
machine, OpenMP threads competing with other processes make timings erratic. ``--label`` names the
code measured (the table says which modulelens it imported), so figures before and after a change
can be taken the same way. Prints a Markdown table and writes it to
benchmarks/results/stats_overhead[-LABEL].md.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples" / "tinyformer"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from model import TinyConfig, TinyFormer  # noqa: E402
from report import publish  # noqa: E402

import modulelens  # noqa: E402
from modulelens.stats import StatsCollector  # noqa: E402

WAYS: dict[str, int | str | None] = {"plain": None, "every step": 1, "every 10th": 10}
FLOOR = "floor"
BOOTSTRAP = 2000


def make_mlp(width: int, depth: int, n_batch: int):
    layers: list[nn.Module] = [nn.Linear(256, width), nn.ReLU()]
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU(inplace=True)]
    model = nn.Sequential(*layers, nn.Linear(width, 10))
    g = torch.Generator().manual_seed(0)

    def batch():
        return torch.randn(n_batch, 256, generator=g), torch.randint(0, 10, (n_batch,), generator=g)

    return model, batch, F.cross_entropy


def make_tinyformer(layers: int, dim: int, n_batch: int):
    cfg = TinyConfig(n_layers=layers, dim=dim, n_heads=4, max_seq_len=64)
    model = TinyFormer(cfg)
    g = torch.Generator().manual_seed(0)

    def batch():
        x = torch.randint(0, cfg.vocab_size, (n_batch, 65), generator=g)
        return x[:, :-1], x[:, 1:]

    def loss_fn(out, y):
        return F.cross_entropy(out.reshape(-1, cfg.vocab_size), y.reshape(-1))

    return model, batch, loss_fn


def _floor_hooks() -> list:
    """The ``--floor`` way: one-pass moments of every module output and output gradient, nothing else."""
    from torch.nn.modules.module import register_module_forward_hook

    from modulelens.stats.fused import moments_cpu

    kept: list = []

    def post(module, args, out):
        if isinstance(out, torch.Tensor) and out.is_floating_point():
            kept.append(moments_cpu(out, None, 0.99))
            if out.requires_grad and out.grad_fn is not None:
                i = out.output_nr
                out.grad_fn.register_prehook(lambda grads, i=i: kept.append(moments_cpu(grads[i], None, 0.99)))

    return [register_module_forward_hook(post)]


def run_block(model, opt, batch, loss_fn, steps: int, every: int | str | None, clock=time.perf_counter) -> list[float]:
    """Step times of ``steps`` training steps, with a collector sampling every ``every`` steps (None:
    none; :data:`FLOOR`: the floor hooks instead of a collector)."""
    collector = StatsCollector(model, every=every, fx=False, plots=False) if isinstance(every, int) else None
    hooks = _floor_hooks() if every == FLOOR else []
    if collector is not None:
        collector.start()
    times = []
    try:
        for _ in range(steps):
            t0 = clock()
            x, y = batch()
            loss = loss_fn(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            times.append(clock() - t0)
    finally:
        if collector is not None:
            collector.stop()
        for h in hooks:
            h.remove()
    return times


def bootstrap_median(values: list[float], rng: random.Random) -> tuple[float, float, float]:
    """Median of ``values`` and the 95% percentile interval of the median, rounds drawn with replacement."""
    meds = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(BOOTSTRAP))
    return statistics.median(values), meds[int(0.025 * BOOTSTRAP)], meds[int(0.975 * BOOTSTRAP) - 1]


def measure(name: str, make, rounds: int, block_steps: int, seed: int, clock=time.perf_counter,
            floor: bool = False) -> dict:
    torch.manual_seed(0)
    model, batch, loss_fn = make()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ways = {**WAYS, FLOOR: FLOOR} if floor else dict(WAYS)
    for every in ways.values():  # warm-up: allocator, kernels, first-call costs
        run_block(model, opt, batch, loss_fn, 10, every, clock)
    per_round: dict[str, list[float]] = {"every step": [], "every 10th": [], "sampled / plain in the same block": []}
    if floor:
        per_round[FLOOR] = []
    plain_ms: list[float] = []
    keys = list(ways)
    for r in range(rounds):
        times = {k: run_block(model, opt, batch, loss_fn, block_steps, ways[k], clock)
                 for k in keys[r % len(keys):] + keys[: r % len(keys)]}
        plain = statistics.median(times["plain"])
        plain_ms.append(plain * 1e3)
        per_round["every step"].append(statistics.median(times["every step"]) / plain)
        per_round["every 10th"].append(statistics.fmean(times["every 10th"]) / statistics.fmean(times["plain"]))
        ten = times["every 10th"]
        sampled = ten[::10]
        others = [t for i, t in enumerate(ten) if i % 10]
        per_round["sampled / plain in the same block"].append(statistics.median(sampled) / statistics.median(others))
        if floor:
            per_round[FLOOR].append(statistics.median(times[FLOOR]) / plain)
    rng = random.Random(seed)
    return {
        "model": name, "modules": sum(1 for _ in model.modules()), "plain_ms": statistics.median(plain_ms),
        "ratios": {k: bootstrap_median(v, rng) for k, v in per_round.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mlp,tinyformer", help="comma-separated: mlp, wide, tinyformer")
    ap.add_argument("--rounds", type=int, default=16, help="interleaved rounds (the bootstrap draws from them)")
    ap.add_argument("--block-steps", type=int, default=10, help="training steps per block (a multiple of 10)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--label", default="", help="names the code measured, e.g. before/after")
    ap.add_argument("--seed", type=int, default=0, help="of the bootstrap")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="wall: time.perf_counter; cpu: the training thread's CPU time (steadier on a loaded machine)")
    ap.add_argument("--floor", action="store_true", help="also measure the floor: output and gradient moments only")
    args = ap.parse_args()
    if args.block_steps % 10:
        ap.error("--block-steps must be a multiple of 10")
    torch.set_num_threads(args.threads)
    makers = {
        "mlp": ("MLP 8x1024, batch 256", lambda: make_mlp(1024, 8, 256)),
        "wide": ("MLP 4x2048, batch 256", lambda: make_mlp(2048, 4, 256)),
        "tinyformer": ("TinyFormer 4 layers x 64, batch 8x64", lambda: make_tinyformer(4, 64, 8)),
    }
    results = []
    for which in args.model.split(","):
        if which not in makers:
            ap.error(f"unknown model {which!r}")
        clock = time.thread_time if args.clock == "cpu" else time.perf_counter
        results.append(measure(*makers[which], args.rounds, args.block_steps, args.seed, clock, args.floor))
    label = f" [{args.label}]" if args.label else ""
    lines = [
        f"# gather-stats training overhead{label} ({_dt.datetime.now().isoformat(timespec='seconds')})",
        "",
        f"{platform.machine()} CPU, {torch.get_num_threads()} thread(s), torch {torch.__version__}, modulelens from "
        f"{Path(modulelens.__file__).parent}; load average {os.getloadavg()[0]:.1f} at the end; "
        f"{'CPU time of the training thread' if args.clock == 'cpu' else 'wall clock'}. {args.rounds} "
        f"interleaved rounds of {args.block_steps}-step blocks per way; median over rounds [95% bootstrap interval].",
        "",
        "| model | modules | plain step | every step (sampled / plain) | every 10th (run time / plain) "
        "| sampled / plain in the same block |" + (" floor: output and gradient moments only |" if args.floor else ""),
        "|---|---:|---:|---:|---:|---:|" + ("---:|" if args.floor else ""),
    ]
    for r in results:
        cells = [f"{m:.3f}x [{lo:.3f}, {hi:.3f}]" for m, lo, hi in r["ratios"].values()]
        lines.append(f"| {r['model']} | {r['modules']} | {r['plain_ms']:.1f} ms | " + " | ".join(cells) + " |")
    publish("stats_overhead" + (f"-{args.label}" if args.label else ""), lines)


if __name__ == "__main__":
    main()
