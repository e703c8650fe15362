"""capture_ops: record the aten operators a captured module runs, as ranked operator cards."""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, Field

from modulelens.capture.replay import LoadedCapture
from modulelens.capture.tracer import set_rng_states
from modulelens.capture.values import Encoder, TensorSink, flatten, leaves
from modulelens.errors import ModuleLensError
from modulelens.ops.cards import KIND, card_summary_fields
from modulelens.ops.recorder import OpRecorder, OpTimer, Variant
from modulelens.registry import Tool, ToolContext, register
from modulelens.repo import Repository


class CaptureOpsRequest(BaseModel):
    ref: str = Field(
        description="A capture reference (name, name:v3, name@tag), or a script / KernelBench file to capture "
        "first (then --module and script arguments apply, as in capture-module).",
        json_schema_extra={"cli": "argument"},
    )
    script_args: list[str] = Field(default_factory=list, description="Arguments for a script (on the CLI, after --).",
                                   json_schema_extra={"cli": "argument"})
    module: str = Field("", description="With a script: the module to capture first (see capture-module).")
    strategy: str = Field("auto", description="Replay strategy used to rebuild the module (auto, source, export, pickle).")
    trust_pickle: bool = Field(False, description="Allow the pickle strategy.")
    backward: bool = Field(False, description="Also record the backward operators (forward + backward run).")
    samples: int = Field(2, ge=1, le=16, description="Sample calls kept per card (inputs and eager outputs).")
    repeats: int = Field(15, ge=3, description="Timed runs used to measure time shares (medians).")
    max_tensor_bytes: int = Field(64 * 1024 * 1024, description="Sample tensors larger than this are stored shape-only.")
    include_views: bool = Field(False, description="Also list view/metadata operators (view, t, detach, ...).")
    allow_synthesized: bool = Field(False, description="Record even when the capture's inputs are shape-only (synthesised).")


class CardSummary(BaseModel):
    card_id: str = Field(description="Use with show-op-card, replay-op-card, profile.")
    op: str = Field(description="aten operator overload.")
    kind: str = Field(description="memory (bandwidth-bound), compute (matmul/conv/attention) or view.")
    phase: str = Field(description="forward or backward.")
    shapes: list[list[int]]
    dtypes: list[str]
    strides: list[list[int] | None]
    contiguous: list[bool]
    device: str
    args: list[Any] = Field(description="Non-tensor arguments.")
    calls: int = Field(description="Calls of this variant in one module run.")
    time_s: float = Field(description="Median seconds spent in this variant per module run.")
    time_share: float = Field(description="time_s divided by the measured module run time.")
    bytes_per_call: int = Field(description="Bytes of distinct input and output tensors per call.")


class CaptureOpsResult(BaseModel):
    opset: str = Field(description="Reference of the stored opset (cards are <opset>/<index>).")
    capture: str
    strategy: str
    module_time_s: float = Field(description="Median plain run time of the module (same runs as the shares).")
    module_time_p20_s: float
    module_time_p80_s: float
    repeats: int
    cards_time_share: float = Field(description="Sum of the listed cards' shares: the part of the run inside operators.")
    views_time_share: float = Field(description="Share spent in view/metadata operators.")
    cards: list[CardSummary]
    notes: list[str] = Field(default_factory=list)


def _capture_first(req: CaptureOpsRequest, ctx: ToolContext) -> str:
    from modulelens.tools.capture_module import CaptureModuleRequest, capture_module

    cap = capture_module(
        CaptureModuleRequest(script=req.ref, script_args=req.script_args, module=req.module,
                             max_tensor_bytes=req.max_tensor_bytes, backward=req.backward), ctx)
    return cap.ref


def _grad_outputs(loaded: LoadedCapture, outs: list[torch.Tensor]) -> list[torch.Tensor]:
    grads = loaded.grads() if loaded.manifest.backward is not None else {}
    gen = torch.Generator().manual_seed(0)
    result = []
    for i, o in enumerate(outs):
        g = grads.get(f"grad_output.{i}")
        if g is None or tuple(g.shape) != tuple(o.shape):
            g = torch.randn(o.shape, generator=gen, dtype=torch.float32)
        result.append(g.to(o.device, o.dtype))
    return result


def capture_ops(req: CaptureOpsRequest, ctx: ToolContext) -> CaptureOpsResult:
    repo = Repository(ctx.repo_root)
    ref = _capture_first(req, ctx) if Path(req.ref).suffix == ".py" or Path(req.ref).is_file() else req.ref
    art = repo.open("captures", ref)
    m = art.manifest
    inputs = leaves(m["inputs"])
    stored = [s for s in inputs if s.get("stored", True)]
    if not inputs:
        raise ModuleLensError(
            f"capture {art.ref} has no tensor inputs",
            "operator cards need real inputs as the oracle; capture a module that takes tensors",
        )
    if not stored and not req.allow_synthesized:
        raise ModuleLensError(
            f"capture {art.ref} stores its inputs shape-only, so the cards would hold synthetic samples",
            "capture again with a larger --max-tensor-bytes, or pass --allow-synthesized",
        )
    device = m.get("environment", {}).get("device", "cpu")
    loaded = LoadedCapture(art, device=device)
    base_args, base_kwargs = loaded.inputs()
    rng = loaded.rng()
    grad_mode = bool(m["grad_enabled"]) or req.backward
    cuda = device.startswith("cuda")

    def fresh():
        a = [x.detach().clone().requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor) else x for x in base_args]
        k = {n: v.detach().clone().requires_grad_(v.requires_grad) if isinstance(v, torch.Tensor) else v
             for n, v in base_kwargs.items()}
        return a, k

    def run(module, a, k, phase_cb=None):
        if rng:
            set_rng_states(rng)
        with torch.set_grad_enabled(grad_mode):
            out = module(*a, **k)
            if req.backward:
                outs = [o for o in flatten(out) if isinstance(o, torch.Tensor) and o.requires_grad]
                if phase_cb:
                    phase_cb()
                if outs:
                    torch.autograd.backward(outs, _grad_outputs(loaded, outs))
        return out

    def record(module):
        recorder = OpRecorder(samples=req.samples)
        a, k = fresh()
        with recorder:
            run(module, a, k, phase_cb=lambda: setattr(recorder, "phase", "backward"))
        return module, recorder

    (module, recorder), strategy, _, _ = loaded.with_strategy(req.strategy, req.trust_pickle, record)
    if req.backward and not any(v.phase == "backward" for v in recorder.variants.values()):
        notes = ["backward was asked for, but no output required grad: only forward operators were recorded"]
    else:
        notes = []

    # Time shares: interleave plain runs (module time) with runs under the per-op timer.
    for _ in range(2):
        run(module, *fresh())
    plain: list[float] = []
    per_variant: dict[str, list[float]] = {key: [] for key in recorder.variants}
    for _ in range(req.repeats):
        a, k = fresh()
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        run(module, a, k)
        if cuda:
            torch.cuda.synchronize()
        plain.append(time.perf_counter() - t0)
        timer = OpTimer()
        a, k = fresh()
        with timer:
            run(module, a, k)
        for key in per_variant:
            per_variant[key].append(timer.seconds.get(key, 0.0))
    module_time = statistics.median(plain)
    q = statistics.quantiles(plain, n=5) if len(plain) >= 5 else [min(plain)] * 4
    variants = sorted(recorder.variants.values(), key=lambda v: -statistics.median(per_variant[v.key]))
    listed = [v for v in variants if req.include_views or v.kind != "view"]
    views_share = sum(statistics.median(per_variant[v.key]) for v in variants if v.kind == "view") / module_time

    sink = TensorSink("", req.max_tensor_bytes)
    cards_meta = []
    for i, v in enumerate(listed):
        cards_meta.append(_card(v, i, statistics.median(per_variant[v.key]), module_time, sink))

    def write(folder: Path) -> dict[str, Any]:
        if sink.tensors:
            from safetensors.torch import save_file

            save_file(sink.tensors, str(folder / "samples.safetensors"))
        return {
            "capture": art.ref, "strategy": strategy, "device": device, "backward": req.backward,
            "module_time": {"median_s": module_time, "p20_s": q[0], "p80_s": q[-1], "repeats": req.repeats},
            "views_time_share": views_share, "cards": cards_meta, "notes": notes,
            "timer": "time.perf_counter around each operator call (CUDA synchronised) inside a TorchDispatchMode; "
                     "module time from plain runs interleaved with the timed ones",
        }

    opset = repo.create(KIND, art.name, write)
    for c in opset.manifest["cards"]:
        c["card_id"] = f"{opset.ref}/{c['index']}"
    cards = [CardSummary(**card_summary_fields(c)) for c in opset.manifest["cards"]]
    return CaptureOpsResult(
        opset=opset.ref, capture=art.ref, strategy=strategy, module_time_s=module_time, module_time_p20_s=q[0],
        module_time_p80_s=q[-1], repeats=req.repeats, cards_time_share=sum(c.time_share for c in cards),
        views_time_share=views_share, cards=cards, notes=notes,
    )


def _card(v: Variant, index: int, seconds: float, module_time: float, sink: TensorSink) -> dict[str, Any]:
    samples = []
    for j, s in enumerate(v.samples):
        prefix = f"c{index}.s{j}."
        enc = Encoder(sink)
        sink.prefix = prefix
        sample = {"args": enc.encode(list(s.args), "args"), "kwargs": enc.encode(dict(s.kwargs), "kwargs"),
                  "output": enc.encode(s.output, "output")}
        if s.rng is not None:
            sink.tensors[prefix + "rng"] = s.rng.clone()
            sample["rng"] = prefix + "rng"
        samples.append(sample)
    sink.prefix = ""
    return {
        "index": index, "card_id": f"?/{index}", "op": v.op, "kind": v.kind, "phase": v.phase,
        "shapes": [t["shape"] for t in v.tensors], "dtypes": [t["dtype"] for t in v.tensors],
        "strides": [t["stride"] for t in v.tensors], "contiguous": [t["contiguous"] for t in v.tensors],
        "device": v.tensors[0]["device"] if v.tensors else "cpu", "args": v.others, "calls": v.calls,
        "time_s": seconds, "time_share": seconds / module_time if module_time else 0.0,
        "bytes_per_call": v.bytes_per_call, "uninitialised_output": v.uninitialised, "samples": samples,
    }


def render_cards(r: CaptureOpsResult):
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=escape(f"operator cards {r.opset} (from {r.capture}, {r.strategy})"), title_justify="left")
    for col in ("card", "op", "kind", "shapes", "dtypes", "calls", "time/run", "share"):
        t.add_column(col)
    for c in r.cards:
        t.add_row(escape(c.card_id), escape(c.op), c.kind + ("" if c.phase == "forward" else " (bw)"),
                  escape(" ".join(str(s) for s in c.shapes)), escape(",".join(sorted(set(c.dtypes)))), str(c.calls),
                  f"{c.time_s * 1e6:.1f} us", f"{c.time_share:.1%}")
    t.caption = (f"module run: median {r.module_time_s * 1e3:.3f} ms (p20 {r.module_time_p20_s * 1e3:.3f}, "
                 f"p80 {r.module_time_p80_s * 1e3:.3f}) over {r.repeats} runs; listed cards cover "
                 f"{r.cards_time_share:.0%} of it, view operators {r.views_time_share:.0%}"
                 + escape("".join(f"\nnote: {n}" for n in r.notes)))
    return t


TOOL = register(
    Tool(
        name="capture_ops",
        request=CaptureOpsRequest,
        result=CaptureOpsResult,
        fn=capture_ops,
        summary="Record every aten operator a captured module runs (replayed under a TorchDispatchMode), grouped "
        "into variants (op, shapes, dtypes, strides, args, device) stored as operator cards with sample inputs and "
        "eager outputs, ranked by measured share of the module's run time.",
        render=render_cards,
    )
)
