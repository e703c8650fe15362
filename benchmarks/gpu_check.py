"""One command for whoever has a GPU: the triton and cuda templates on LLM-sized cards, checked
against eager and timed (under five minutes on one H100/H200).

    python benchmarks/gpu_check.py [--all-variants] [--only gelu,softmax]

For each synthetic card (shapes of real transformer layers) it renders the triton and cuda
templates (variant 0, or every variant with ``--all-variants``, keeping the fastest correct one),
checks them against eager on the GPU (per-dtype tolerances, widened by eager's own distance from a
float64 reference), times eager and template with CUDA events and a flushed L2
(``modulelens.timing.time_callable(fn, "cuda")``), prints a Markdown table and writes it
to ``benchmarks/results/gpu_check.md``. The CUDA extensions are built first, in parallel processes
(each ``load_inline`` build takes ~30 s). Exit status 1 when a template is wrong or fails.

Without a GPU it says so, compile-checks the cuda templates of the same cards with nvcc (the cards
are made from meta tensors), and exits 0.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

TOL = {torch.float32: (1.3e-6, 1e-5), torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5)}


def cases(device: str) -> list[tuple[str, str, list, dict, tuple[str, ...]]]:
    """(label, op, args, kwargs, backends); tensors made on ``device`` ("cuda" or "meta")."""
    f32, f16, bf16 = torch.float32, torch.float16, torch.bfloat16

    def r(*shape, dtype=f32, scale=1.0):
        if device == "meta":
            return torch.empty(*shape, dtype=dtype, device="meta")
        return (torch.randn(*shape, device=device, dtype=torch.float32) * scale).to(dtype)

    both, tri = ("triton", "cuda"), ("triton",)
    return [
        ("gelu", "aten.gelu.default", [r(4096, 16384)], {}, both),
        ("gelu", "aten.gelu.default", [r(4096, 16384, dtype=f16)], {}, both),
        ("gelu_tanh", "aten.gelu.default", [r(4096, 16384, dtype=bf16)], {"approximate": "tanh"}, tri),
        ("bias_add", "aten.add.Tensor", [r(8192, 4096, dtype=f16), r(4096, dtype=f16)], {}, both),
        ("softmax", "aten._softmax.default", [r(32, 16, 1024, 1024, dtype=f16, scale=4), -1, False], {}, both),
        ("safe_softmax", "aten._safe_softmax.default", [r(8, 16, 1024, 1024, scale=4), -1], {}, both),
        ("softmax_long_rows", "aten._softmax.default", [r(64, 65536, scale=4), -1, False], {}, tri),
        ("layer_norm", "aten.native_layer_norm.default", [r(8192, 4096, scale=2), [4096], r(4096), r(4096), 1e-5], {}, both),
        ("layer_norm", "aten.native_layer_norm.default",
         [r(8192, 4096, dtype=bf16), [4096], r(4096, dtype=bf16), r(4096, dtype=bf16), 1e-5], {}, tri),
        ("rms_norm", "aten._fused_rms_norm.default", [r(8192, 4096, dtype=bf16), [4096], r(4096, dtype=bf16), 1e-6], {}, both),
        ("group_norm", "aten.native_group_norm.default", [r(32, 512, 32, 32), r(512), r(512), 32, 512, 1024, 32, 1e-5], {}, tri),
        ("row_sum", "aten.sum.dim_IntList", [r(8192, 4096), [-1]], {}, tri),
        ("adaptive_avg_pool", "aten._adaptive_avg_pool2d.default", [r(64, 512, 14, 14), [7, 7]], {}, tri),
    ]


def _build_cuda(source: str) -> str:
    """In a worker process: build (and cache) one CUDA extension; '' or a short error."""
    from modulelens.kernels import get_backend

    try:
        get_backend("cuda").load(source, "forward", None)
        return ""
    except Exception as e:  # noqa: BLE001 - reported in the table
        return f"{type(e).__name__}: {e}"[:300]


def _flat(x):
    return list(x) if isinstance(x, (tuple, list)) else [x]


def compare(got, want, exact) -> tuple[bool, float, str]:
    ok, worst, why = True, 0.0, ""
    for g, w, x in zip(_flat(got), _flat(want), _flat(exact)):
        if g.shape != w.shape or g.dtype != w.dtype:
            return False, float("nan"), f"shape/dtype {tuple(g.shape)} {g.dtype} != {tuple(w.shape)} {w.dtype}"
        rtol, atol = TOL.get(w.dtype, (1e-3, 1e-5))
        gd, wd, xd = g.double(), w.double(), x.double()
        if not torch.equal(torch.isnan(gd), torch.isnan(wd)):
            return False, float("nan"), "NaN positions differ"
        err = (gd - wd).abs().nan_to_num(0.0)
        slack = 2 * (wd - xd).abs().nan_to_num(0.0)
        bad = err > atol + rtol * wd.abs().nan_to_num(0.0) + slack
        worst = max(worst, float(err.max()))
        if bool(bad.any()):
            ok, why = False, f"{int(bad.sum())} of {w.numel()} values off"
    return ok, worst, why


def run_gpu(all_variants: bool, only: set[str] | None) -> int:
    from report import publish

    from modulelens.kernels import get_backend
    from modulelens.kernels import templates as T
    from modulelens.ops import resolve_op
    from modulelens.timing import CallableSide, ThreadChoice, TimingPlan, measure_speedup, time_callable

    torch.manual_seed(0)
    t0 = time.time()
    dev = torch.cuda.get_device_name()
    plan = []  # (label, op, args, kwargs, card, backend, [KernelSource...])
    for label, op, args, kwargs, backends in cases("cuda"):
        if only and label not in only:
            continue
        card = T.synthetic_card(op, args, kwargs)
        for be in backends:
            n = T.variants(card, be)
            sources = [T.render(card, be, v) for v in (range(n) if all_variants else range(min(n, 1)))]
            plan.append((label, op, args, kwargs, card, be, sources))
    cuda_sources = sorted({ks.source for *_, be, srcs in plan if be == "cuda" for ks in srcs})
    build_errors: dict[str, str] = {}
    if cuda_sources:
        print(f"building {len(cuda_sources)} CUDA extension(s) in parallel ...", flush=True)
        import multiprocessing as mp

        workers = max(1, min(len(cuda_sources), (os.cpu_count() or 4) // 2, 8))
        with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as pool:
            for src, err in zip(cuda_sources, pool.map(_build_cuda, cuda_sources)):
                if err:
                    build_errors[src] = err
        print(f"  built in {time.time() - t0:.0f} s", flush=True)

    rows, failures = [], 0
    for label, op, args, kwargs, _card, be, sources in plan:
        aten = resolve_op(op)
        want = aten(*args, **kwargs)
        exact = aten(*[a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args], **kwargs)
        shape = " ".join(str(list(a.shape)) for a in args if isinstance(a, torch.Tensor))
        dtype = str(next(a for a in args if isinstance(a, torch.Tensor)).dtype).removeprefix("torch.")
        t_eager = time_callable(lambda aten=aten, args=args, kwargs=kwargs: aten(*args, **kwargs), "cuda").median_s
        best = None
        notes = []
        for ks in sources:
            try:
                if ks.source in build_errors:
                    raise RuntimeError(build_errors[ks.source])
                fn = get_backend(be).load(ks.source, "forward", None)
                got = fn(*args, *kwargs.values())
                torch.cuda.synchronize()
                ok, err, why = compare(got, want, exact)
                del got
                if not ok:
                    notes.append(f"v{ks.params['variant']}: {why}")
                    continue
                m = measure_speedup(  # CUDA events on the current stream, L2 flushed, interleaved with eager
                    CallableSide("eager", lambda aten=aten, args=args, kwargs=kwargs: aten(*args, **kwargs), "cuda"),
                    CallableSide("candidate", lambda fn=fn, args=args, kwargs=kwargs: fn(*args, *kwargs.values()),
                                 "cuda"), TimingPlan(budget_s=2.0), ThreadChoice(threads=1, why="GPU kernels"))
                t = m.candidate.median_s if m.candidate else float("inf")
                if best is None or (m.lower or 0.0) > (best[3].lower or 0.0):
                    best = (t, err, ks.params["variant"], m)
            except Exception as e:  # noqa: BLE001 - reported in the table
                notes.append(f"v{ks.params['variant']}: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
        if best is None:
            failures += 1
            rows.append(f"| {label} ({op.removeprefix('aten.')}) | {shape} | {dtype} | {be} | no | - | "
                        f"{t_eager * 1e6:.1f} | - | - | {'; '.join(notes)[:300]} |")
        else:
            t, err, v, m = best
            ratio = f"{m.speedup:.2f}x" if m.status == "ok" else "undetermined"
            if m.interval:
                ratio += f" ({m.interval[0]:.2f}..{m.interval[1]:.2f})"
            rows.append(f"| {label} ({op.removeprefix('aten.')}) | {shape} | {dtype} | {be} | yes | {err:.3g} | "
                        f"{t_eager * 1e6:.1f} | {t * 1e6:.1f} (v{v}) | {ratio} | {'; '.join(notes)[:200]} |")
        print(rows[-1], flush=True)
        del want, exact
        torch.cuda.empty_cache()
    publish("gpu_check", [
        f"# templates on the GPU: {dev} (torch {torch.__version__}, CUDA {torch.version.cuda})",
        "",
        f"variant 0 of each template{' (all variants, fastest correct shown)' if all_variants else ''}; medians of "
        "CUDA-event timings with the L2 flushed before each call; correct = within per-dtype tolerance of eager "
        f"(widened by eager's distance from float64); {time.time() - t0:.0f} s in all",
        "",
        "| op | shape | dtype | backend | correct | max abs err | eager us | template us | speedup | notes |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *rows,
    ])
    return 1 if failures else 0


def run_compile_only(only: set[str] | None) -> int:
    from modulelens.kernels import CompileError, get_backend
    from modulelens.kernels import templates as T

    cuda = get_backend("cuda")
    st = cuda.status()
    print(f"no CUDA device on this machine: nothing to run or time. {st.why}")
    if not st.can_compile:
        print("nvcc not found either: skipping the compile-only pass")
        return 0
    print("compile-only pass of the cuda templates for the same cards (nvcc, cached by source hash):", flush=True)
    bad = 0
    for label, op, args, kwargs, backends in cases("meta"):
        if "cuda" not in backends or (only and label not in only):
            continue
        card = T.synthetic_card(op, args, kwargs)
        ks = T.render(card, "cuda")
        shape = " ".join(str(list(a.shape)) for a in args if isinstance(a, torch.Tensor))
        try:
            log = cuda.compile_only(ks.source, None)
            print(f"  {label:14s} {shape:32s} ok: {log}", flush=True)
        except CompileError as e:
            bad += 1
            print(f"  {label:14s} {shape:32s} FAILED: {e.message}", flush=True)
    print("compile errors in the cuda templates: " + str(bad) if bad else "all cuda templates compile")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--all-variants", action="store_true", help="try every variant and keep the fastest correct one")
    ap.add_argument("--only", default="", help="comma-separated case labels (gelu, softmax, layer_norm, ...)")
    a = ap.parse_args()
    only = {x.strip() for x in a.only.split(",") if x.strip()} or None
    if torch.cuda.is_available():
        return run_gpu(a.all_variants, only)
    return run_compile_only(only)


if __name__ == "__main__":
    sys.exit(main())
