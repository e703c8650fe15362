"""What the contained sandbox costs, what the fork server saves and what the new layers add, in one run.

    python benchmarks/sandbox_cost.py [--before-ref e9f1fc3] [--repeats 5] [--validations 8] [--quick]

Everything validates an already-built C++ template candidate for a captured ``LayerNorm(256)``
card (so no compile time is measured) and is taken in this one run, side by side:

1. **CLI, one process per command** (the acceptance of issue 22): ``modulelens validate-kernel CAND
   --no-time`` against replaying its card alone (``replay-module CARD``; ``replay-op-card`` before),
   alternated ``--repeats`` times, for the
   code before (``--before-ref``, extracted with ``git archive``, run with ``PYTHONPATH``) and this
   tree; medians of wall-clock seconds and their ratio.
2. **Time to a ready candidate process** (start until it answered a ready request), p50/p90, forked
   from a template vs started fresh (``MODULELENS_FORK_SERVER=0``).
3. **Validations per minute** in one long-lived process (warm pool), without timing and with the
   default timing, with the fork server on and disabled.
4. **Cost of the layers** added by issue 24, each timed where it runs (a candidate's namespaces,
   the checker's confinement, the sealed arena's reads against a mapped copy, forking a template
   with torch imported).
5. **Per call**: a checked call's round trip through the arena, and a bare call.

Prints Markdown tables and writes them to ``benchmarks/results/sandbox_cost.md``. The machine is
whatever it is: on a loaded one every figure moves, the ratios taken side by side much less.
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
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("OMP_NUM_THREADS", "1")

from report import publish  # noqa: E402

LEGIT = "import torch\n\ndef forward(x, dim, half_to_float):\n    return torch.softmax(x, dim)\n"

LAYERS = r'''
import json, os, sys, time
import torch
from modulelens.sandbox.containment import apply_landlock, apply_rlimits, not_dumpable, private_tmp, readable_roots
from modulelens.sandbox.mounts import private_dev
from modulelens.sandbox.seccomp import apply_seccomp
scratch = sys.argv[1]
out = {}
def timed(name, fn):
    t = time.perf_counter(); layer = fn(); out[name] = (time.perf_counter() - t, layer.in_force)
readable = readable_roots([scratch])
timed("private /tmp", lambda: private_tmp(readable))
timed("private /dev", private_dev)
timed("rlimits", lambda: apply_rlimits(4096, True))
timed("not dumpable", not_dumpable)
timed("landlock", lambda: apply_landlock([scratch], readable, private_dev=out["private /dev"][1]))
timed("seccomp", apply_seccomp)
print(json.dumps(out))
'''


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def setup(repo: Path) -> tuple[str, str]:
    """A LayerNorm capture, its card, and a C++ template candidate for it, built once (card, candidate)."""
    import torch
    import torch.nn as nn

    import modulelens
    from modulelens.registry import ToolContext
    from modulelens.tools.capture_ops import CaptureOpsRequest, capture_ops
    from modulelens.tools.generate_kernel import GenerateKernelRequest, generate_kernel

    with modulelens.capture("", name="ln", repo=repo, export=False):
        nn.LayerNorm(256)(torch.randn(64, 256))
    ctx = ToolContext(repo_root=repo)
    card = capture_ops(CaptureOpsRequest(ref="ln", repeats=3), ctx).cards[0].card_id
    cand = generate_kernel(GenerateKernelRequest(card=card, backend="cpp", provider="template"), ctx).candidate_id
    return card, cand


def _cli(tree: Path, repo: Path, *args: str) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree), "MODULELENS_HOME": str(repo)}
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "modulelens", *args, "--json"], capture_output=True, text=True,
                          env=env, timeout=1800, cwd=repo.parent)  # not ROOT: `-m` puts the cwd first on sys.path
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed with {tree}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    result = json.loads(done.stdout)
    if args[0] == "validate-kernel" and result.get("verdict") != "custom":
        raise SystemExit(f"expected a custom verdict from {tree}, got {result.get('verdict')}: {result.get('reason')}")
    return seconds


def replay_args(tree: Path, card: str) -> list[str]:
    """Replaying a card alone: ``replay-op-card CARD`` before the tools were folded, ``replay-module CARD`` after."""
    return ["replay-op-card", card] if (tree / "modulelens" / "tools" / "replay_op_card.py").exists() else \
        ["replay-module", card]


def cli_rows(trees: dict[str, Path], repo: Path, card: str, cand: str, repeats: int) -> dict[str, dict[str, float]]:
    """Median wall seconds of validate (no timing) and replay, per tree, alternated."""
    for tree in trees.values():
        _cli(tree, repo, "validate-kernel", cand, "--no-time")  # builds (or loads) the candidate once
    times: dict[str, dict[str, list[float]]] = {name: {"validate": [], "replay": []} for name in trees}
    for _ in range(repeats):
        for name, tree in trees.items():
            times[name]["validate"].append(_cli(tree, repo, "validate-kernel", cand, "--no-time"))
            times[name]["replay"].append(_cli(tree, repo, *replay_args(tree, card)))
    return {name: {k: _median(v) for k, v in t.items()} for name, t in times.items()}


def ready_times(n: int, fork: bool) -> list[float]:
    from modulelens.sandbox.forkserver import DISABLE
    from modulelens.validation.candidate_messages import ReadyRequest
    from modulelens.validation.checker import start_candidate

    os.environ[DISABLE] = "1" if fork else "0"
    out = []
    try:
        for _ in range(n + 1):
            t0 = time.perf_counter()
            proc = start_candidate(4096, read_only=[])
            try:
                proc.request(ReadyRequest(backend="cpp"), timeout=300)
                out.append(time.perf_counter() - t0)
            finally:
                proc.remove()
    finally:
        os.environ[DISABLE] = "1"
    return out[1:]  # the first fork starts the template


def per_minute(repo: Path, cand: str, n: int, fork: bool, timed: bool) -> float:
    import modulelens.sandbox.pool as pools
    from modulelens.registry import ToolContext
    from modulelens.sandbox.forkserver import DISABLE
    from modulelens.tools.validate_kernel import ValidateKernelRequest, validate_kernel

    os.environ[DISABLE] = "1" if fork else "0"
    saved, pools._POOLS = pools._POOLS, {}
    try:
        req = ValidateKernelRequest(candidate=cand, time=timed)
        validate_kernel(req, ToolContext(repo_root=repo))  # a warm worker
        t0 = time.perf_counter()
        for _ in range(n):
            r = validate_kernel(req, ToolContext(repo_root=repo))
            assert r.verdict == "custom", r.reason
        return 60 * n / (time.perf_counter() - t0)
    finally:
        for p in pools._POOLS.values():
            p.close()
        pools._POOLS = saved
        os.environ[DISABLE] = "1"


def layer_costs(scratch: Path) -> dict[str, tuple[float, bool]]:
    """Seconds of each candidate layer, applied in a child started in new namespaces."""
    from modulelens.sandbox.containment import namespace_prefix

    prefix, _ = namespace_prefix()
    done = subprocess.run([*prefix, sys.executable, "-c", LAYERS, str(scratch)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if done.returncode != 0:
        raise SystemExit(f"layer timing failed:\n{done.stderr[-2000:]}")
    return {k: tuple(v) for k, v in json.loads(done.stdout.strip().splitlines()[-1]).items()}


def checker_and_arena_costs(scratch: Path) -> dict[str, float]:
    """Forking a process that imported torch (the template), the checker's confinement (in a fork),
    and reading 4 MiB from the sealed arena by pread against a mapped copy."""
    import mmap

    import torch

    from modulelens.sandbox.containment import confine_checker
    from modulelens.sandbox.shm import SharedArena, sealed_memfd

    out = {}
    forks = []
    for _ in range(10):
        t0 = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        forks.append(time.perf_counter() - t0)
    out["fork of a template with torch imported (and reap)"] = _median(forks)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        t0 = time.perf_counter()
        confine_checker([str(scratch)], [str(scratch)], {"the repository": str(ROOT)})
        os.write(w, str(time.perf_counter() - t0).encode())
        os._exit(0)
    os.close(w)
    out["checker confinement (Landlock, not dumpable, secrets probed)"] = float(os.read(r, 64))
    os.waitpid(pid, 0)
    t0 = time.perf_counter()
    for _ in range(20):
        os.close(sealed_memfd(1 << 20)[0])
    out["a sealed 1 MiB memfd made"] = (time.perf_counter() - t0) / 20
    arena = SharedArena(8 << 20)
    slot = arena.put(torch.randn(1 << 20), 0)
    reads = []
    for _ in range(20):
        t0 = time.perf_counter()
        arena.read(slot)
        reads.append(time.perf_counter() - t0)
    out["read 4 MiB from the arena (pread, checker)"] = _median(reads)
    mapped = mmap.mmap(arena.fd, arena.size, mmap.MAP_SHARED, mmap.PROT_READ)
    view = torch.frombuffer(mapped, dtype=torch.float32, count=1 << 20)
    copies = []
    for _ in range(20):
        t0 = time.perf_counter()
        view.clone()
        copies.append(time.perf_counter() - t0)
    out["read 4 MiB from a mapping (before)"] = _median(copies)
    del view
    mapped.close()
    arena.close()
    return out


def per_call(samples: int) -> dict[str, float]:
    import torch

    from modulelens.kernels import KernelSource
    from modulelens.sandbox.shm import aligned, encode_value
    from modulelens.validation.candidate_messages import CallRequest, LoadRequest
    from modulelens.validation.checker import start_candidate, time_calls

    x = torch.randn(64, 96)
    proc = start_candidate(4096, read_only=[])
    try:
        proc.request(LoadRequest(candidate=KernelSource(backend="triton", source=LEGIT),
                                 build_dir=str(proc.scratch / "build")), timeout=300)
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
    finally:
        proc.remove()
    return {"checked": _median(checked), "bare": _median(one)}


def _before_tree(ref: str, into: Path) -> Path:
    into.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "modulelens"], capture_output=True, check=True)
    path = into / "before.tar"
    path.write_bytes(archive.stdout)
    with tarfile.open(path) as tar:
        tar.extractall(into, filter="data")
    return into


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before-ref", default="e9f1fc3", help="the code before the fork server and new layers")
    parser.add_argument("--repeats", type=int, default=5, help="CLI runs of each command per tree")
    parser.add_argument("--validations", type=int, default=8, help="validations per throughput figure")
    parser.add_argument("--quick", action="store_true", help="only the CLI table, 2 runs each, printed (not published)")
    args = parser.parse_args()
    if args.quick:
        args.repeats = min(args.repeats, 2)
    lines: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        card, cand = setup(repo)
        before = _before_tree(args.before_ref, Path(tmp) / "before")
        cli = cli_rows({"before": before, "after": ROOT}, repo, card, cand, args.repeats)
        lines += [f"## CLI, one process per command (medians of {args.repeats}, alternated)", "",
                  "| code | validate-kernel --no-time | replaying the card | ratio |", "|---|---:|---:|---:|"]
        lines += [f"| {name} ({args.before_ref if name == 'before' else 'this tree'}) | {t['validate']:.2f} s | "
                  f"{t['replay']:.2f} s | {t['validate'] / t['replay']:.2f}x |" for name, t in cli.items()]
        if args.quick:
            print("\n".join(lines + ["", f"load average {os.getloadavg()[0]:.1f} when done"]))
            return
        forked, fresh = ready_times(12, True), ready_times(6, False)
        lines += ["", "## Time to a ready candidate process", "", "| started | p50 | p90 |", "|---|---:|---:|",
                  f"| forked from a template | {_median(forked) * 1e3:.0f} ms | {_pct(forked, 0.9) * 1e3:.0f} ms |",
                  f"| fresh (MODULELENS_FORK_SERVER=0) | {_median(fresh) * 1e3:.0f} ms | {_pct(fresh, 0.9) * 1e3:.0f} ms |"]
        lines += ["", f"## Validations per minute (one process, warm pool, {args.validations} validations each)", "",
                  "| fork server | without timing | with default timing |", "|---|---:|---:|"]
        for fork in (True, False):
            rates = [per_minute(repo, cand, args.validations, fork, timed) for timed in (False, True)]
            lines.append(f"| {'on' if fork else 'disabled'} | {rates[0]:.1f} | {rates[1]:.1f} |")
        from modulelens.sandbox.cleanup import remove_tree
        from modulelens.validation.checker import candidates_folder

        candidates_folder().mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix="sandbox-cost-", dir=candidates_folder()))  # not under /tmp
        try:
            lines += ["", "## Cost of the layers", "", "| layer | seconds | in force |", "|---|---:|---|"]
            lines += [f"| candidate: {name} | {s * 1e3:.2f} ms | {'yes' if ok else 'no'} |"
                      for name, (s, ok) in layer_costs(scratch).items()]
            lines += [f"| {name} | {s * 1e3:.3f} ms | yes |" for name, s in checker_and_arena_costs(scratch).items()]
        finally:
            remove_tree(scratch)
        calls = per_call(200)
        lines += ["", "## Per call", "", "| call | round trip |", "|---|---:|",
                  f"| checked (inputs in, outputs back through the arena, ops traced) | {calls['checked'] * 1e3:.3f} ms |",
                  f"| bare (a repeat request of one call) | {calls['bare'] * 1e3:.3f} ms |"]
    load = os.getloadavg()[0]
    lines += ["", f"machine: {os.cpu_count()} CPUs, load average {load:.1f} when done; OMP_NUM_THREADS="
              f"{os.environ.get('OMP_NUM_THREADS')}"]
    publish("sandbox_cost", lines)


if __name__ == "__main__":
    main()
