"""What the separated, contained sandbox costs against the previous in-process validator, in one run.

    python benchmarks/sandbox_cost.py [--old-ref 0aa73d4] [--repeats 3]

Both validate the same candidate (a plain-Python softmax through the triton backend, so no build
time is measured) against the same captured softmax card, through ``validate_kernel`` with a warm
sandbox worker and ``--no-time``:

* **per validation**: end-to-end seconds of one validation. The old code (``--old-ref``, default
  the commit before the separation) is extracted with ``git archive`` into a temporary folder and
  run in a subprocess; the new code is this tree. The difference is the set-up of a contained
  candidate process (namespaces, Landlock, Python + torch import, profiler) plus the arena traffic.
* **per call**: the new sandbox's round trip for one call of the candidate (a ``repeat`` request
  of one call, timed by the checker) and for a checked call (inputs written to the arena, outputs
  read back, ops traced), against a direct in-process call of the same function (the old path).

Prints a Markdown table and writes it to ``benchmarks/results/sandbox_cost.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = "import torch\n\ndef forward(x, dim, half_to_float):\n    return torch.softmax(x, dim)\n"

MEASURE = r'''
import json, sys, time, statistics, tempfile, pathlib
import torch, torch.nn as nn
import modulelens
from modulelens.registry import ToolContext
from modulelens.tools.capture_ops import CaptureOpsRequest, capture_ops
from modulelens.tools.validate_kernel import ValidateKernelRequest, validate_kernel

class Head(nn.Module):
    def __init__(self):
        super().__init__(); self.proj = nn.Linear(32, 96)
    def forward(self, x):
        return torch.softmax(self.proj(x), dim=-1)

repo = pathlib.Path(tempfile.mkdtemp())
with modulelens.capture("", name="head", repo=repo, export=False):
    Head()(torch.randn(64, 32))
ops = capture_ops(CaptureOpsRequest(ref="head", repeats=3), ToolContext(repo_root=repo))
card = next(c for c in ops.cards if c.op == "aten._softmax.default").card_id
req = ValidateKernelRequest(source_text=sys.argv[1], target=card, backend="triton", time=False)
validate_kernel(req, ToolContext(repo_root=repo))  # warm the worker
times = []
for _ in range(int(sys.argv[2])):
    t0 = time.perf_counter()
    r = validate_kernel(req, ToolContext(repo_root=repo))
    times.append(time.perf_counter() - t0)
print(json.dumps({"median_s": statistics.median(times), "verdict": r.verdict, "checks": len(r.checks)}))
'''


def _run_measure(pythonpath: Path, repeats: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(pythonpath), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    done = subprocess.run([sys.executable, "-c", MEASURE, SOURCE, str(repeats)], capture_output=True, text=True,
                          env=env, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"measurement failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _old_tree(ref: str, into: Path) -> Path:
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "modulelens"], capture_output=True, check=True)
    path = into / "old.tar"
    path.write_bytes(archive.stdout)
    with tarfile.open(path) as tar:
        tar.extractall(into, filter="data")
    return into


def _per_call(samples: int) -> dict:
    sys.path.insert(0, str(ROOT))
    import torch

    from modulelens.kernels.source import KernelSource
    from modulelens.sandbox.shm import aligned, encode_value
    from modulelens.validation.candidate_messages import CallRequest, LoadRequest
    from modulelens.validation.checker import start_candidate, time_calls

    x = torch.randn(64, 96)
    fn = lambda a, d, h: torch.softmax(a, d)  # noqa: E731
    for _ in range(20):
        fn(x, -1, False)
    t0 = time.perf_counter()
    for _ in range(samples):
        fn(x, -1, False)
    direct = (time.perf_counter() - t0) / samples

    t0 = time.perf_counter()
    proc = start_candidate(6144, read_only=[])
    try:
        loaded = proc.request(LoadRequest(candidate=KernelSource(backend="triton", source=SOURCE),
                                          build_dir=str(proc.scratch / "build")), timeout=300)
        setup = time.perf_counter() - t0
        proc.arena.resize(1 << 20)
        args = [encode_value(v, lambda t: proc.arena.put(t, 0)) for v in (x, -1, False)]
        call = CallRequest(arena_size=proc.arena.size, args=args, output_offset=aligned(x.numel() * 4), trace=True)
        checked = []
        for _ in range(20):
            t1 = time.perf_counter()
            proc.request(call, timeout=60)
            checked.append(time.perf_counter() - t1)
        bare = call.model_copy(update={"trace": False})
        one = [time_calls(proc, bare, 60)[0] for _ in range(samples)]
        batch = time_calls(proc, bare.model_copy(update={"calls": samples}), 60)[0] / samples
    finally:
        proc.remove()
    return {"direct_s": direct, "setup_s": setup, "checked_call_s": statistics.median(checked),
            "round_trip_s": statistics.median(one), "batched_s": batch, "isolation": loaded.isolation.summary()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old-ref", default="0aa73d4", help="commit of the previous (in-process) validator")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        old = _run_measure(_old_tree(args.old_ref, Path(tmp)), args.repeats)
    new = _run_measure(ROOT, args.repeats)
    calls = _per_call(200)
    rows = [
        ("validation, end to end (warm worker, no timing)", old["median_s"], new["median_s"]),
        ("candidate process start + load (set-up)", 0.0, calls["setup_s"]),
        ("one checked call (arena in/out, ops traced)", calls["direct_s"], calls["checked_call_s"]),
        ("one bare call, round trip over the pipe", calls["direct_s"], calls["round_trip_s"]),
        ("one call inside a timed batch of 200", calls["direct_s"], calls["batched_s"]),
    ]
    lines = ["| what | old (in-process) | new (separated) |", "|---|---:|---:|"]
    lines += [f"| {what} | {o * 1e3:.3f} ms | {n * 1e3:.3f} ms |" for what, o, n in rows]
    lines.append("")
    lines.append(f"verdicts: old {old['verdict']} ({old['checks']} checks), new {new['verdict']} ({new['checks']} checks)")
    lines.append(f"isolation of the new sandbox here: {calls['isolation']}")
    text = "\n".join(lines)
    print(text)
    out = ROOT / "benchmarks" / "results" / "sandbox_cost.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n")


if __name__ == "__main__":
    main()
