"""Which edge cases each template family is checked on, and whether its templates pass them.

    python benchmarks/edge_cases.py --quick      # cpp, variant 0 of each family (cached builds: seconds)
    python benchmarks/edge_cases.py              # cpp and triton (interpreter without a GPU), every variant
    python benchmarks/edge_cases.py --backend triton   # one backend, every variant

For one representative card per family (the shapes ``tests/test_kernels_templates.py`` uses, so
the cpp builds are shared; fewer rows of the same lengths for triton, interpreted without a GPU), the card's edge cases (:mod:`modulelens.validation.edge_cases`:
structural cases and OpInfo samples) are run through the family's template, loaded in this process
(no sandbox: these are our own kernels), and judged as validation judges: per-dtype tolerances,
then the float64 oracle. Prints one Markdown row per family, backend and variant: the structural
cases, the OpInfo samples and their source, and the cases that failed (none expected).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from modulelens.kernels import default_build_dir, get_backend  # noqa: E402
from modulelens.kernels import templates as T  # noqa: E402
from modulelens.ops import resolve_op  # noqa: E402
from modulelens.validation.compare import compare_output, float64_args, within_oracle  # noqa: E402
from modulelens.validation.edge_cases import edge_cases, ensure_opinfo_values  # noqa: E402
from modulelens.validation.inputs import tensors  # noqa: E402


def family_calls(small: bool = False) -> dict[str, tuple[str, list, dict]]:
    """One (op, args, kwargs) per template family (and GELU, SiLU for the exp-overflow cases);
    ``small``: fewer rows (the triton interpreter takes seconds per call at the cpp shapes), the
    same row lengths, so the looped variants still loop."""
    g = torch.Generator().manual_seed(0)
    rows = 2 if small else 8

    def r(*s):
        return torch.randn(*s, generator=g)

    x4 = r(rows, 4, 32, 32) if not small else r(1, 2, 8, 32)
    masked = x4.clone()
    masked[0, 1, 5, :7] = float("-inf")  # a partly masked row, as captured attention scores have
    return {
        "elementwise (gelu)": ("aten.gelu.default", [r(rows, 32, 256)], {}),
        "elementwise (silu)": ("aten.silu.default", [r(4, 100)], {}),
        "elementwise (add)": ("aten.add.Tensor", [x4, r(*x4.shape[-2:])], {"alpha": 2}),
        "softmax": ("aten._safe_softmax.default", [masked, -1], {}),
        "softmax_backward": ("aten._softmax_backward_data.default",
                             [r(2, 4, 16, 16), torch.softmax(r(2, 4, 16, 16), -1), -1, torch.float32], {}),
        "layer_norm": ("aten.native_layer_norm.default", [r(rows, 32, 64) * 3 + 5, [64], r(64), r(64), 1e-5], {}),
        "rms_norm": ("aten._fused_rms_norm.default", [r(rows, 32, 64), [64], r(64), 1e-6], {}),
        "group_norm": ("aten.native_group_norm.default", [r(2, 8, 5, 3) + 3, r(8), r(8), 2, 8, 15, 4, 1e-5], {}),
        "reduction (amax)": ("aten.amax.default", [r(4, 37, 600 if not small else 100), [1], True], {}),
        "reduction (mean)": ("aten.mean.dim", [r(rows, 32, 64), [1], True], {}),
        "pooling": ("aten._adaptive_avg_pool2d.default", [r(2, 3, 10, 7), [3, 5]], {}),
    }


@dataclass
class FamilyRun:
    """One family's template (backend, variant) on its card's edge cases."""

    family: str
    op: str
    backend: str
    variant: int
    structural: list[str] = field(default_factory=list)
    opinfo: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


def _judged(got: torch.Tensor, want: torch.Tensor, oracle: torch.Tensor | None) -> str:
    ok, detail = compare_output(got, want, None, None)
    if ok or oracle is None or not want.is_floating_point():
        return "" if ok else detail
    return "" if within_oracle(got, want, oracle)[0] else detail


def run_family(name: str, backend: str, variant: int) -> FamilyRun:
    op_name, args, kwargs = family_calls(small=backend == "triton")[name]
    card = T.synthetic_card(op_name, args, kwargs)
    ks = T.render(card, backend, variant)
    fn = get_backend(backend).load(ks.source, ks.entry, default_build_dir())
    op = resolve_op(op_name)
    ensure_opinfo_values(op_name)
    run = FamilyRun(ks.family, op_name, backend, variant)
    for case in edge_cases(op_name, args, kwargs):
        (run.opinfo if case.source.startswith("OpInfo") else run.structural).append(case.source)
        want = tensors(op(*[a.clone() if isinstance(a, torch.Tensor) else a for a in case.args], **case.kwargs))
        oracle = tensors(op(*float64_args(list(case.args)), **case.kwargs))
        got = tensors(fn(*case.args, *case.kwargs.values()))
        for i, (g, w) in enumerate(zip(got, want)):
            o = oracle[i] if i < len(oracle) and oracle[i].shape == w.shape else None
            problem = _judged(g, w, o)
            if problem:
                run.failed.append(f"{case.label}: output {i}: {problem}")
                break
    return run


def runs(backends: tuple[str, ...], every_variant: bool, names: tuple[str, ...] | None = None) -> list[FamilyRun]:
    """One :class:`FamilyRun` per family call (``names``: only those of :func:`family_calls`), backend
    and variant (``every_variant``: all of them, else variant 0)."""
    out = []
    for name in names or tuple(family_calls()):
        for backend in backends:
            op_name, args, kwargs = family_calls(small=backend == "triton")[name]
            card = T.synthetic_card(op_name, args, kwargs)
            if T.why_not(card, backend) is not None:
                continue
            n = T.variants(card, backend)
            for v in range(n) if every_variant else [0]:
                out.append(run_family(name, backend, v))
    return out


def table(rows: list[FamilyRun]) -> str:
    lines = ["| family | op | backend | variant | structural cases | OpInfo samples | failed |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        structural = ", ".join(s.removeprefix("structural: ") for s in r.structural)
        opinfo = f"{len(r.opinfo)}" + (f" ({r.opinfo[0].split(' sample')[0]})" if r.opinfo else "")
        lines.append(f"| {r.family} | {r.op.removeprefix('aten.')} | {r.backend} | {r.variant} | {structural} | "
                     f"{opinfo} | {'; '.join(r.failed) or 'none'} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="cpp, variant 0 only")
    parser.add_argument("--backend", choices=("cpp", "triton"), help="only this backend, every variant")
    a = parser.parse_args()
    rows = runs(("cpp",), False) if a.quick else runs((a.backend,) if a.backend else ("cpp", "triton"), True)
    print(table(rows))


if __name__ == "__main__":
    main()
