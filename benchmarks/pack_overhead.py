"""What an applied kernel pack costs and gains on the example transformer, as ratios measured in one run.

    python benchmarks/pack_overhead.py [--blocks 8] [--block-steps 10] [--threads 1]

First the pack is made the way a user makes it, in a temporary repository: capture ``blocks.1``
of examples/tinyformer/train.py with gradients, record its operator cards, generate and validate
the C++ template kernels for softmax and layer norm, validate the fused block
(examples/tinyformer/fused_block.py) as a module-level candidate, pack the three.

Then TinyFormer training steps (forward, cross-entropy, backward, AdamW) run in interleaved
blocks of ``--block-steps`` steps whose order rotates every block, so drift and background load
hit every variant alike:

* **no entry matches** (batch 16, while every entry was validated at batch 8): every call of a
  packed operator or module goes through its guard and falls back, the worst case for the
  non-matching path. Once with the ``library`` mechanism (the default: torch.library kernels on
  the packed operators only), once with ``mode`` (a TorchDispatchMode that sees every operator).
  Goal: at most 1% slower than no pack.
* **the example with its pack** (batch 8, as validated): step time with the pack applied
  (``library``) against without.

Also: the extra microseconds one call of a packed operator costs when it matches no entry.

Each ratio is the variant's median block time divided by the median block time without a pack
(and the same for the fastest block of each: load on a shared machine only ever adds time). Prints a Markdown table and writes it to benchmarks/results/pack_overhead.md.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ROOT / "examples" / "tinyformer" / "train.py"
FUSED = ROOT / "examples" / "tinyformer" / "fused_block.py"
sys.path.insert(0, str(ROOT / "examples" / "tinyformer"))

from model import TinyConfig, TinyFormer  # noqa: E402

import modulelens as ml  # noqa: E402


def _speedup(rep) -> str:
    interval = f" (95% {rep.speedup_interval[0]:.2f}..{rep.speedup_interval[1]:.2f})" if rep.speedup_interval else ""
    return (f"{rep.speedup_vs_eager:.2f}x" if rep.speedup_vs_eager is not None else "undetermined") + interval


def make_pack(repo: Path, out: Path) -> list[str]:
    ops = ml.capture_ops(str(TRAIN), ["--steps", "2"], module="blocks.1", backward=True, repo=str(repo))
    cards = {c.op: c.card_id for c in ops.cards if c.phase == "forward"}
    ids = []
    for op in ("aten._safe_softmax.default", "aten.native_layer_norm.default"):
        gen = ml.generate_kernel(cards[op], backend="cpp", provider="template", repo=str(repo))
        rep = ml.validate_kernel(gen.candidate_id, repo=str(repo))
        print(f"{gen.candidate_id} ({op}): {rep.verdict}, {_speedup(rep)} vs eager", flush=True)
        ids.append(gen.candidate_id)
    from modulelens.tools import get_tool

    module_tool = get_tool("validate_kernel")
    from modulelens.registry import ToolContext

    mod = module_tool(module_tool.request(source=str(FUSED), target=ops.capture, claims_training=True),
                      ToolContext(repo_root=repo))
    print(f"{mod.candidate_id} (fused Block): {mod.verdict}, {_speedup(mod)} vs eager", flush=True)
    ids.append(mod.candidate_id)
    packed = ml.pack(ids, out=str(out), repo=str(repo), force=True)  # the overhead is measured with every entry used
    for e in packed.entries:
        print(f"  packed {e.candidate_id}: dispatched={e.dispatched} {e.skip_reason or ''}", flush=True)
    return ids


class Trainer:
    def __init__(self, batch: int, seq: int = 32):
        torch.manual_seed(0)
        self.cfg = TinyConfig()
        self.model = TinyFormer(self.cfg).train()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.gen = torch.Generator().manual_seed(0)
        self.batch, self.seq = batch, seq

    def steps(self, n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            seq = torch.randint(0, self.cfg.vocab_size, (self.batch, self.seq + 1), generator=self.gen)
            logits = self.model(seq[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, self.cfg.vocab_size), seq[:, 1:].reshape(-1))
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()
        return time.perf_counter() - t0


def measure(pack: Path, blocks: int, block_steps: int) -> tuple[dict[str, float], dict[str, float], dict[str, int]]:
    variants = {
        "no pack, batch 16": (16, None),
        "no entry matches, library (batch 16)": (16, "library"),
        "no entry matches, mode (batch 16)": (16, "mode"),
        "no pack, batch 8": (8, None),
        "the example's pack, library (batch 8)": (8, "library"),
    }
    trainers = {name: Trainer(batch) for name, (batch, _) in variants.items()}
    applied = {name: ml.apply_pack(trainers[name].model, pack, mechanism=mech)
               for name, (_, mech) in variants.items() if mech}
    for name in variants:  # warm-up (first builds, allocator)
        trainers[name].steps(3)
    times: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for b in range(blocks):
        order = names[b % len(names):] + names[:b % len(names)]
        for name in order:
            times[name].append(trainers[name].steps(block_steps))
        print(f"block {b + 1}/{blocks} done", flush=True)
    hits = {name: a.report().hits for name, a in applied.items()}
    fallbacks = {name + " (fallbacks)": a.report().fallbacks for name, a in applied.items()}
    for a in applied.values():
        a.remove()
    medians = {name: statistics.median(ts) / block_steps for name, ts in times.items()}
    fastest = {name: min(ts) / block_steps for name, ts in times.items()}
    return medians, fastest, {**hits, **fallbacks}


def miss_cost(pack: Path, pairs: int = 400) -> dict[str, float]:
    """Median extra microseconds of one call of a packed operator that matches no entry (batch 16
    shapes), from back-to-back pairs of the same call without and with the pack active."""
    x = torch.randn(16, 4, 32, 32, requires_grad=True)
    y, w, b = torch.randn(16, 32, 64, requires_grad=True), torch.randn(64), torch.randn(64)
    calls = {"_safe_softmax": lambda: torch.ops.aten._safe_softmax(x, -1),
             "native_layer_norm": lambda: torch.ops.aten.native_layer_norm(y, [64], w, b, 1e-5)}
    out = {}
    for mech in ("library", "mode"):
        ctx = ml.use_pack(pack, mechanism=mech)
        for name, fn in calls.items():
            extra = []
            for _ in range(pairs):
                t0 = time.perf_counter()
                fn()
                t1 = time.perf_counter()
                with ctx:
                    t2 = time.perf_counter()
                    fn()
                    t3 = time.perf_counter()
                extra.append((t3 - t2) - (t1 - t0))
            out[f"{name}, {mech}"] = statistics.median(extra) * 1e6
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--block-steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="modulelens-pack-bench-") as tmp:
        pack = Path(tmp) / "tiny.pack"
        make_pack(Path(tmp) / "repo", pack)
        medians, fastest, counts = measure(pack, args.blocks, args.block_steps)
        misses = miss_cost(pack)
    rows = []
    for name, m in medians.items():
        base = "no pack, batch 16" if "16" in name else "no pack, batch 8"
        rows.append(f"| {name} | {m * 1e3:.2f} | {m / medians[base]:.3f} | {fastest[name] / fastest[base]:.3f} | "
                    f"{counts.get(name, '')} | {counts.get(name + ' (fallbacks)', '')} |")
    table = "\n".join([
        f"Pack overhead and gain, TinyFormer training steps ({_dt.date.today()}, torch {torch.__version__}, "
        f"{platform.processor() or platform.machine()}, {args.threads} thread(s), {args.blocks} interleaved blocks of "
        f"{args.block_steps} steps; ratio = median step time / the same batch without a pack)",
        "",
        "| variant | median step (ms) | ratio of medians | ratio of fastest blocks | hits | fallbacks |",
        "| --- | --- | --- | --- | --- | --- |",
        *rows,
        "",
        "Extra time of one call that matches no entry (median of back-to-back pairs, microseconds): "
        + ", ".join(f"{k} {v:.1f} us" for k, v in misses.items()),
    ])
    print(table)
    out = ROOT / "benchmarks" / "results" / "pack_overhead.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(table + "\n")


if __name__ == "__main__":
    main()
