"""Peak memory of capturing and replaying a module whose activations or weights are big.

    python benchmarks/big_activation.py [--batch 64] [--tokens 2304] [--dim 1024] [--budget-mib 256]
                                        [--module mlp|norm]
    python benchmarks/big_activation.py --module weight [--weight-mib 512] [--budget-mib 256]

The module (``mlp``: LayerNorm -> GELU, and a Linear, over the last dimension; ``norm``: LayerNorm
alone, the least memory a forward can take) treats batch rows independently, so above the byte
budget the capture keeps the first batch rows and replay is exact on them; with a budget above the
activations, everything is stored and replayed in full (comparison chunk by chunk). Each
step runs in a fresh process whose peak RSS (``ru_maxrss``) is reported: the plain forward (the
floor: input and output alone), the capture, and the replay. Prints a Markdown table and writes it
to benchmarks/results/.

``weight``: one Linear whose weight takes ``--weight-mib`` (a KernelBench problem with one big
weight), on a small input, captured with export on (the default). It is captured twice: with a
budget above the weight (stored once, in ``weights.safetensors``; the export program is saved
without it) and with ``--budget-mib`` below it (stored shape-only). The table gives each capture's
peak RSS above the plain run, as a multiple of the bytes the capture keeps on disk: the stated
bound is that a capture's overhead stays under 1.5 x the data it keeps plus 256 MiB (torch.export's
tracing, statistics chunks).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn as nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))


class RowMLP(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.proj = nn.Linear(dim, 64)

    def forward(self, x):
        return torch.cat([nn.functional.gelu(self.norm(x))[..., :-64], self.proj(x)], dim=-1)


def _weight_child(args: argparse.Namespace, out: dict) -> None:
    """The weight problem: one Linear of ``--weight-mib``, a batch of 8 rows."""
    import modulelens

    cols = 4096
    rows = max(1, args.weight_mib * 2**20 // (4 * cols))
    x = torch.randn(8, cols)
    if args.child == "forward":
        with torch.no_grad():
            nn.Linear(cols, rows)(x)
        return
    if args.child == "replay":
        rep = modulelens.replay_module(args.name, strategy="source", repo=args.repo)
        out.update(match=rep.match, exact=rep.exact, compared=rep.compared, notes=rep.notes[-1:])
        return
    budget = (args.weight_mib * 2 + 64) * 2**20 if args.child == "capture" else args.budget_mib * 2**20
    with modulelens.capture("", name=args.name, repo=args.repo, max_capture_bytes=budget) as cap, torch.no_grad():
        nn.Linear(cols, rows)(x)
    from modulelens.capture import capture_manifest

    out["weights"] = capture_manifest(cap.artifact).weights_storage.mode
    out["kept_bytes"] = sum(f.stat().st_size for f in Path(cap.artifact.path).rglob("*") if f.is_file())


def _child(args: argparse.Namespace) -> None:
    import modulelens

    torch.manual_seed(0)
    out: dict = {}
    t0 = time.perf_counter()
    if args.module == "weight":
        _weight_child(args, out)
    elif args.child in ("forward", "capture"):
        x = torch.randn(args.batch, args.tokens, args.dim)
        out["activation_bytes"] = 2 * x.numel() * x.element_size()
        build = (lambda: RowMLP(args.dim)) if args.module == "mlp" else (lambda: nn.LayerNorm(args.dim))
        if args.child == "forward":
            with torch.no_grad():
                build()(x)
        else:
            with modulelens.capture("", name="big", repo=args.repo, max_capture_bytes=args.budget_mib * 2**20,
                                    export=False) as cap, torch.no_grad():
                build()(x)
            from modulelens.capture import capture_manifest

            out["activations"] = capture_manifest(cap.artifact).activations.model_dump()
    else:
        rep = modulelens.replay_module("big", strategy="source", repo=args.repo)
        out.update(match=rep.match, exact=rep.exact, max_abs_error=rep.max_abs_error, compared=rep.compared)
    out["seconds"] = time.perf_counter() - t0
    out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(out))


def _run(step: str, args: argparse.Namespace, repo: str, name: str = "big") -> dict:
    cmd = [sys.executable, __file__, "--child", step, "--repo", repo, "--batch", str(args.batch),
           "--tokens", str(args.tokens), "--dim", str(args.dim), "--budget-mib", str(args.budget_mib),
           "--module", args.module, "--weight-mib", str(args.weight_mib), "--name", name]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True, env={"OMP_NUM_THREADS": "2", **_env()})
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _env() -> dict:
    import os

    return dict(os.environ)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--tokens", type=int, default=2304)
    p.add_argument("--dim", type=int, default=1024)
    p.add_argument("--budget-mib", type=int, default=256)
    p.add_argument("--module", choices=("mlp", "norm", "weight"), default="mlp")
    p.add_argument("--weight-mib", type=int, default=512)
    p.add_argument("--child", default=None)
    p.add_argument("--repo", default=None)
    p.add_argument("--name", default="big")
    args = p.parse_args()
    if args.child:
        _child(args)
        return
    if args.module == "weight":
        _weight_main(args)
        return
    from report import publish

    with tempfile.TemporaryDirectory() as repo:
        forward, capture, replay = (_run(step, args, repo) for step in ("forward", "capture", "replay"))
    act = capture["activations"]
    gib = forward["activation_bytes"] / 2**30
    publish(f"big_activation_{args.module}_{args.budget_mib}", [
        f"# Big activations ({args.module}): {args.batch} x {args.tokens} x {args.dim} float32 in and out "
        f"({gib:.2f} GiB of activations), budget {args.budget_mib} MiB",
        "",
        "| step | peak RSS (MiB) | seconds |",
        "|---|---|---|",
        f"| plain forward (floor) | {forward['peak_rss_mib']:.0f} | {forward['seconds']:.1f} |",
        f"| capture | {capture['peak_rss_mib']:.0f} | {capture['seconds']:.1f} |",
        f"| replay (source) | {replay['peak_rss_mib']:.0f} | {replay['seconds']:.1f} |",
        "",
        (f"Stored: {act['mode']}, {act['rows']} of {act['batch_rows']} rows (check max abs error "
         f"{act['check_max_abs_error']})." if act["mode"] == "batch_slice" else f"Stored: {act['mode']}.")
        + f" Replay: match={replay['match']}, "
        f"exact={replay['exact']}, max_abs_error={replay['max_abs_error']}.",
    ])


def _weight_main(args: argparse.Namespace) -> None:
    from report import publish

    with tempfile.TemporaryDirectory() as repo:
        floor = _run("forward", args, repo)
        stored = _run("capture", args, repo, "stored")
        shape_only = _run("capture-small-budget", args, repo, "shape")
        replays = [_run("replay", args, repo, name) for name in ("stored", "shape")]
    rows = []
    for label, cap, rep in (("budget above the weight", stored, replays[0]),
                            (f"budget {args.budget_mib} MiB", shape_only, replays[1])):
        over = cap["peak_rss_mib"] - floor["peak_rss_mib"]
        kept = cap["kept_bytes"] / 2**20
        rows.append(f"| capture, {label} | {cap['weights']} | {kept:.1f} | {cap['peak_rss_mib']:.0f} | {over:.0f} | "
                    f"{over / max(kept, 1e-9):.2f} | {cap['seconds']:.1f} | match={rep['match']} exact={rep['exact']} "
                    f"compared={rep['compared']} |")
    publish(f"big_weight_{args.weight_mib}", [
        f"# One {args.weight_mib} MiB weight (Linear, float32, input 8 x 4096), captured with export on",
        "",
        f"Plain run (the floor): peak RSS {floor['peak_rss_mib']:.0f} MiB.",
        "",
        "| step | weights | kept on disk (MiB) | peak RSS (MiB) | above the floor (MiB) | above floor / kept | "
        "seconds | replay (source) |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        "Bound stated in the docstring: overhead under 1.5 x kept + 256 MiB.",
    ])


if __name__ == "__main__":
    main()
