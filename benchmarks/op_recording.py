"""Cost of recording operators, and how close memory-bound cards get to this machine's bandwidth.

    python benchmarks/op_recording.py [--steps 2]

One run: capture blocks.1 of the example transformer, then (1) interleave plain replays of the
block with replays under the OpRecorder (counting + 2 samples per variant) and under the OpTimer,
and report median ratios to the plain replay; (2) record its cards and profile the memory-bound
ones, reporting achieved bandwidth as a fraction of the measured copy bandwidth. Writes Markdown
to benchmarks/results/.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent

from report import publish  # noqa: E402

from modulelens.capture import LoadedCapture  # noqa: E402
from modulelens.ops.recorder import OpRecorder, OpTimer  # noqa: E402
from modulelens.registry import ToolContext  # noqa: E402
from modulelens.repo import Repository  # noqa: E402
from modulelens.tools.capture_module import CaptureModuleRequest, capture_module  # noqa: E402
from modulelens.tools.capture_ops import CaptureOpsRequest, capture_ops  # noqa: E402
from modulelens.tools.profile import ProfileRequest, profile  # noqa: E402


def main() -> None:
    repo = Path(tempfile.mkdtemp(prefix="ml-bench-ops-"))
    ctx = ToolContext(repo_root=repo)
    train = ROOT / "examples" / "tinyformer" / "train.py"
    cap = capture_module(CaptureModuleRequest(script=str(train), module="blocks.1", name="blk", export=False,
                                              script_args=["--steps", "2", "--batch-size", "16", "--seq-len", "64",
                                                           "--dim", "128"]), ctx)
    loaded = LoadedCapture(Repository(repo).open("captures", cap.ref))
    module = loaded.build("source")
    args, kwargs = loaded.inputs()

    def plain():
        module(*args, **kwargs)

    def recorded():
        with OpRecorder(samples=2):
            module(*args, **kwargs)

    def timed():
        with OpTimer():
            module(*args, **kwargs)

    runs = {"plain": [], "recorder": [], "timer": []}
    fns = {"plain": plain, "recorder": recorded, "timer": timed}
    for _ in range(3):
        for f in fns.values():
            f()
    for _ in range(30):
        for name, f in fns.items():  # interleaved, so drift hits all three alike
            t0 = time.perf_counter()
            f()
            runs[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in runs.items()}

    ops = capture_ops(CaptureOpsRequest(ref=cap.ref), ctx)
    memory = [c for c in ops.cards if c.kind == "memory" and c.shapes and c.time_share > 0.005][:6]
    rows = []
    for c in memory:
        p = profile(ProfileRequest(target=c.card_id, breakdown=False, min_run_time=0.3), ctx)
        rows.append((c.op, c.shapes, p.median_s, p.p20_s, p.p80_s, p.bytes_moved, p.achieved_bytes_per_s,
                     p.roofline_fraction, p.copy_bytes_per_s))
    copy_bw = rows[0][8] if rows else float("nan")

    lines = [
        f"# operator recording overhead and roofline (torch {torch.__version__}, {torch.get_num_threads()} threads)",
        "",
        f"block input {list(args[0].shape)}; 30 interleaved runs each; medians",
        "",
        "| run | median ms | ratio to plain |",
        "|---|---|---|",
        *[f"| {k} | {v * 1e3:.3f} | {v / med['plain']:.2f}x |" for k, v in med.items()],
        "",
        f"capture-ops: module {ops.module_time_s * 1e3:.3f} ms, cards cover {ops.cards_time_share:.0%} "
        f"(+ views {ops.views_time_share:.0%})",
        "",
        f"machine copy bandwidth: {copy_bw / 1e9:.2f} GB/s",
        "",
        "| memory-bound card | shapes | median us (p20-p80) | bytes/call | GB/s | fraction of copy bw |",
        "|---|---|---|---|---|---|",
        *[f"| {op} | {shapes} | {m * 1e6:.1f} ({lo * 1e6:.1f}-{hi * 1e6:.1f}) | {b} | {bw / 1e9:.2f} | {frac:.1%} |"
          for op, shapes, m, lo, hi, b, bw, frac, _ in rows],
    ]
    publish("op_recording", lines)


if __name__ == "__main__":
    sys.exit(main())
