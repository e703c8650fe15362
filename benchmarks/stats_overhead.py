"""Training-step overhead of gather-stats, measured in one run as ratios.

    python benchmarks/stats_overhead.py [--model mlp,wide,tinyformer] [--blocks 8] [--repeats 3] [--threads 1]

Four ways of training the same model run interleaved, block by block (each block is
``--block-steps`` training steps, a multiple of 10; their order rotates every block so that drift
and background load hit all of them alike): without statistics, with statistics every 10 steps
(the default: moments of tensors over 65,536 elements estimated from a strided view of 65,536 of
them), every 10 steps fully exact (``sample=0``), and on every step (default sampling). A block's time includes the sampled steps' hook work and the
end-of-step transfer of the statistics (not the one-time fx trace and saving at the end of a run).
Within one repeat, the overhead of a way is its median block time divided by the median block time
without statistics. The whole measurement is repeated (``--repeats``, on a fresh model each time) and
the table gives the median overhead over the repeats and its range (lowest-highest): machines are
noisy, so a single figure says little. Also reported: how much slower one sampled step is than a
plain one (median over repeats).

Models: ``mlp`` (8 Linear+ReLU(inplace) layers, width 1024, batch 256), ``wide`` (4 layers of width
2048, batch 256) and ``tinyformer`` (examples/tinyformer, 4 layers of width 64, batch 8x64: many
small modules, the worst case for per-module cost). The cost of a sampled step grows with the number
of activation and parameter elements, the model's compute with width times elements: wider layers
mean a smaller overhead. One thread by default (``--threads``): on a shared machine, OpenMP threads
competing with other processes make timings erratic. Prints a Markdown table and writes it to
benchmarks/results/stats_overhead.md.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples" / "tinyformer"))

from model import TinyConfig, TinyFormer  # noqa: E402

from modulelens.stats import StatsCollector  # noqa: E402
from modulelens.stats.stats import DEFAULT_SAMPLE  # noqa: E402


def make_mlp(width: int, depth: int) -> tuple[nn.Module, callable]:
    layers: list[nn.Module] = [nn.Linear(256, width), nn.ReLU()]
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU(inplace=True)]
    model = nn.Sequential(*layers, nn.Linear(width, 10))
    g = torch.Generator().manual_seed(0)

    def batch(n: int):
        return torch.randn(n, 256, generator=g), torch.randint(0, 10, (n,), generator=g)

    def loss_fn(out, y):
        return F.cross_entropy(out, y)

    return model, batch, loss_fn


def make_tinyformer(layers: int, dim: int):
    cfg = TinyConfig(n_layers=layers, dim=dim, n_heads=4, max_seq_len=64)
    model = TinyFormer(cfg)
    g = torch.Generator().manual_seed(0)

    def batch(n: int):
        x = torch.randint(0, cfg.vocab_size, (n, 65), generator=g)
        return x[:, :-1], x[:, 1:]

    def loss_fn(out, y):
        return F.cross_entropy(out.reshape(-1, cfg.vocab_size), y.reshape(-1))

    return model, batch, loss_fn


def run_block(model, opt, batch, loss_fn, n_batch: int, steps: int, way: tuple[int, int | None] | None,
              ) -> tuple[float, list[float]]:
    collector = StatsCollector(model, every=way[0], sample=way[1], fx=False) if way else None
    if collector is not None:
        collector.start()
    step_times = []
    t0 = time.perf_counter()
    for _ in range(steps):
        s0 = time.perf_counter()
        x, y = batch(n_batch)
        loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step_times.append(time.perf_counter() - s0)
    total = time.perf_counter() - t0
    if collector is not None:
        collector.stop()
    return total, step_times


def measure(name: str, model, batch, loss_fn, n_batch: int, blocks: int, block_steps: int) -> dict:
    torch.manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ways = {
        "no statistics": None,
        "every 10 steps": (10, DEFAULT_SAMPLE),
        "every 10 steps, exact (sample=0)": (10, 0),
        "every step": (1, DEFAULT_SAMPLE),
    }
    for way in ways.values():  # warm-up: allocator, kernels, first-call costs
        run_block(model, opt, batch, loss_fn, n_batch, 10, way)
    times: dict[str, list[float]] = {k: [] for k in ways}
    sampled_step: list[float] = []
    plain_step: list[float] = []
    keys = list(ways)
    for b in range(blocks):
        for k in keys[b % len(keys):] + keys[: b % len(keys)]:
            total, steps = run_block(model, opt, batch, loss_fn, n_batch, block_steps, ways[k])
            times[k].append(total / block_steps)
            if ways[k] == (10, DEFAULT_SAMPLE):
                sampled_step += steps[::10]
                plain_step += [t for i, t in enumerate(steps) if i % 10]
    base = statistics.median(times["no statistics"])
    return {
        "model": name, "modules": sum(1 for _ in model.modules()),
        "time": {k: statistics.median(v) for k, v in times.items()},
        "ratio": {k: statistics.median(v) / base for k, v in times.items()},
        "sampled_vs_plain": statistics.median(sampled_step) / statistics.median(plain_step),
    }


def repeated(name: str, make, n_batch: int, blocks: int, block_steps: int, repeats: int) -> dict:
    """``measure`` ``repeats`` times on fresh models: per way the median and range of the overhead."""
    runs = []
    for _ in range(repeats):
        model, batch, loss_fn = make()
        runs.append(measure(name, model, batch, loss_fn, n_batch, blocks, block_steps))
    ways = list(runs[0]["ratio"])
    return {
        "model": name, "modules": runs[0]["modules"], "repeats": repeats,
        "time": {k: statistics.median(r["time"][k] for r in runs) for k in ways},
        "ratio": {k: statistics.median(r["ratio"][k] for r in runs) for k in ways},
        "range": {k: (min(r["ratio"][k] for r in runs), max(r["ratio"][k] for r in runs)) for k in ways},
        "sampled_vs_plain": statistics.median(r["sampled_vs_plain"] for r in runs),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mlp,wide,tinyformer", help="comma-separated: mlp, wide, tinyformer")
    ap.add_argument("--blocks", type=int, default=8, help="blocks per way (median over blocks)")
    ap.add_argument("--block-steps", type=int, default=10, help="training steps per block (a multiple of 10)")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3, help="whole measurements per model (median and range)")
    args = ap.parse_args()
    if args.block_steps % 10:
        ap.error("--block-steps must be a multiple of 10")
    torch.set_num_threads(args.threads)
    results = []
    for which in args.model.split(","):
        if which in ("mlp", "wide"):
            depth, width = (8, 1024) if which == "mlp" else (4, 2048)
            results.append(repeated(f"MLP {depth}x{width}, batch {args.batch}", lambda d=depth, w=width: make_mlp(w, d),
                                    args.batch, args.blocks, args.block_steps, args.repeats))
        elif which == "tinyformer":
            results.append(repeated("TinyFormer 4 layers x 64, batch 8x64", lambda: make_tinyformer(4, 64), 8,
                                    args.blocks, args.block_steps, args.repeats))
        else:
            ap.error(f"unknown model {which!r}")
    lines = [
        f"# gather-stats training overhead ({_dt.datetime.now().isoformat(timespec='seconds')})",
        "",
        f"{platform.machine()} CPU, {torch.get_num_threads()} threads, torch {torch.__version__}; "
        f"{args.repeats} repeats of {args.blocks} interleaved blocks of {args.block_steps} steps per way; overhead = "
        "median over repeats of (median block time / median block time without statistics), with its range.",
        "",
        "| model | modules | way | time per step | overhead (median) | overhead range over repeats |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for r in results:
        for k, ratio in r["ratio"].items():
            lo, hi = r["range"][k]
            lines.append(f"| {r['model']} | {r['modules']} | {k} | {r['time'][k] * 1e3:.2f} ms | "
                         f"{(ratio - 1) * 100:+.1f}% | {(lo - 1) * 100:+.1f}% to {(hi - 1) * 100:+.1f}% |")
    lines.append("")
    for r in results:
        lines.append(f"- {r['model']}: one sampled step takes {r['sampled_vs_plain']:.2f}x a plain step "
                     "(hooks, statistics, gradient hooks, parameter copies and one transfer).")
    text = "\n".join(lines) + "\n"
    print(text)
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "stats_overhead.md").write_text(text)


if __name__ == "__main__":
    main()
