"""Replay one block alone vs build-and-run the whole model, measured in one run as ratios.

    python benchmarks/replay_vs_full_model.py [--layers 24] [--dim 256] [--repeats 7]

In-process: median time to (a) build the full TinyFormer and run one forward on a batch, and
(b) rebuild one captured block from the repository (source strategy) and run it on the captured
inputs. End to end (fresh processes): (c) `python train.py --steps 1` vs (d) `modulelens
replay-module`. Prints a Markdown table and writes it to benchmarks/results/.
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

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples" / "tinyformer"))

from model import TinyConfig, TinyFormer  # noqa: E402
from report import publish  # noqa: E402

import modulelens  # noqa: E402
from modulelens.registry import ToolContext  # noqa: E402
from modulelens.tools.replay_module import ReplayModuleRequest, replay_module  # noqa: E402


def median_time(fn, repeats: int) -> tuple[float, float, float]:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return statistics.median(times), times[len(times) // 5], times[(len(times) * 4) // 5]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    torch.manual_seed(0)
    cfg = TinyConfig(dim=args.dim, n_layers=args.layers, n_heads=8, max_seq_len=args.seq)
    idx = torch.randint(0, cfg.vocab_size, (args.batch, args.seq))
    repo = Path(tempfile.mkdtemp(prefix="ml-bench-"))

    with modulelens.capture(f"blocks.{args.layers // 2}", name="bench-block", repo=repo, export=False):
        model = TinyFormer(cfg)
        model(idx)

    def full():
        m = TinyFormer(cfg)
        with torch.no_grad():
            m(idx)

    ctx = ToolContext(repo_root=repo)
    req = ReplayModuleRequest(ref="bench-block", strategy="source")
    replay_module(req, ctx)  # warm imports

    def replay():
        assert replay_module(req, ctx).exact

    full_t = median_time(full, args.repeats)
    replay_t = median_time(replay, args.repeats)

    env = dict(os.environ, MODULELENS_HOME=str(repo))
    train = [sys.executable, str(ROOT / "examples" / "tinyformer" / "train.py"), "--steps", "1",
             "--n-layers", str(args.layers), "--dim", str(args.dim), "--n-heads", "8",
             "--batch-size", str(args.batch), "--seq-len", str(args.seq)]
    cli = [sys.executable, "-m", "modulelens", "replay-module", "bench-block", "--strategy", "source", "--json"]
    e2e_full = median_time(lambda: subprocess.run(train, check=True, capture_output=True, env=env), 3)
    e2e_replay = median_time(lambda: subprocess.run(cli, check=True, capture_output=True, env=env), 3)

    rows = [
        ("in-process: build full model + forward", full_t),
        ("in-process: replay one block (rebuild + load + run + compare)", replay_t),
        ("process: train.py --steps 1 (same model, one training step)", e2e_full),
        ("process: modulelens replay-module (CLI)", e2e_replay),
    ]
    lines = [
        f"# replay vs full model ({args.layers} blocks, dim {args.dim}, batch {args.batch}x{args.seq}, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads)",
        "",
        "| what | median s | p20 s | p80 s |",
        "|---|---|---|---|",
        *[f"| {name} | {m:.4f} | {lo:.4f} | {hi:.4f} |" for name, (m, lo, hi) in rows],
        "",
        f"in-process ratio full/replay: **{full_t[0] / replay_t[0]:.1f}x**",
        f"end-to-end ratio train-step/replay: **{e2e_full[0] / e2e_replay[0]:.2f}x** (both dominated by interpreter + torch import)",
    ]
    publish("replay_vs_full_model", lines)


if __name__ == "__main__":
    main()
