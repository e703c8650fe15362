"""Peak memory of capturing and replaying a module whose activations total over 1 GiB.

    python benchmarks/big_activation.py [--batch 64] [--tokens 2304] [--dim 1024] [--budget-mib 256]
                                        [--module mlp|norm]

The module (``mlp``: LayerNorm -> GELU, and a Linear, over the last dimension; ``norm``: LayerNorm
alone, the least memory a forward can take) treats batch rows independently, so above the byte
budget the capture keeps the first batch rows and replay is exact on them; with a budget above the
activations, everything is stored and replayed in full (comparison chunk by chunk). Each
step runs in a fresh process whose peak RSS (``ru_maxrss``) is reported: the plain forward (the
floor: input and output alone), the capture, and the replay. Prints a Markdown table and writes it
to benchmarks/results/.
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


def _child(args: argparse.Namespace) -> None:
    import modulelens

    torch.manual_seed(0)
    out: dict = {}
    t0 = time.perf_counter()
    if args.child in ("forward", "capture"):
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
            from modulelens.capture.manifest import capture_manifest

            out["activations"] = capture_manifest(cap.artifact).activations.model_dump()
    else:
        rep = modulelens.replay_module("big", strategy="source", repo=args.repo)
        out.update(match=rep.match, exact=rep.exact, max_abs_error=rep.max_abs_error, compared=rep.compared)
    out["seconds"] = time.perf_counter() - t0
    out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(out))


def _run(step: str, args: argparse.Namespace, repo: str) -> dict:
    cmd = [sys.executable, __file__, "--child", step, "--repo", repo, "--batch", str(args.batch),
           "--tokens", str(args.tokens), "--dim", str(args.dim), "--budget-mib", str(args.budget_mib),
           "--module", args.module]
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
    p.add_argument("--module", choices=("mlp", "norm"), default="mlp")
    p.add_argument("--child", default=None)
    p.add_argument("--repo", default=None)
    args = p.parse_args()
    if args.child:
        _child(args)
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


if __name__ == "__main__":
    main()
