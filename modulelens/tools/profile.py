"""profile: time a capture or an operator card fairly and explain every number."""

from __future__ import annotations

from typing import Any

import torch
from pydantic import BaseModel, Field

from modulelens.capture.replay import LoadedCapture
from modulelens.errors import ModuleLensError
from modulelens.ops.cards import is_card_id, open_card, require_tensor_inputs, run_card, sample_call
from modulelens.profiling.bandwidth import copy_bandwidth
from modulelens.profiling.breakdown import OpTime, profile_breakdown
from modulelens.profiling.timing import Timing, time_callable
from modulelens.registry import Tool, ToolContext, register
from modulelens.repo import Repository


class ProfileRequest(BaseModel):
    target: str = Field(description="A capture reference (blk, blk:v2), an operator card id (blk/0) or a candidate id "
                        "(blk.card6:v1, timed in the sandbox).",
                        json_schema_extra={"cli": "argument"})
    device: str | None = Field(None, description="Device to run on (default: where it was captured).")
    min_run_time: float = Field(0.5, gt=0, description="Seconds of timed calls to collect (CPU timer) / at least (CUDA).")
    warmup: int = Field(3, ge=0, description="Untimed calls before timing.")
    breakdown: bool = Field(True, description="Add a torch.profiler breakdown (top operators by self time) and peak memory.")
    strategy: str = Field("auto", description="Replay strategy for captures (auto, source, export, pickle).")


class ProfileResult(Timing):
    target: str
    target_kind: str = Field(description="capture, card or candidate.")
    what: str = Field(description="What one timed call does.")
    grad_enabled: bool = Field(description="Whether autograd recorded during the timed calls.")
    breakdown: list[OpTime] | None = None
    peak_memory_bytes: int | None = None
    peak_memory_method: str | None = None
    bytes_moved: int | None = Field(None, description="Bytes read + written per call (memory-bound cards).")
    achieved_bytes_per_s: float | None = None
    copy_bytes_per_s: float | None = Field(None, description="This machine's measured copy bandwidth (cached per machine).")
    roofline_fraction: float | None = Field(None, description="achieved / copy bandwidth; above 1 means the data sat in cache.")
    notes: list[str] = Field(default_factory=list)


def _on(device: str | None, default: str) -> str:
    device = device or default
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModuleLensError(f"device {device!r} is not available on this machine", "pass --device cpu")
    return device


def _profile_card(req: ProfileRequest, repo: Repository) -> tuple[Any, str, str, bool, dict[str, Any]]:
    art, card = open_card(repo, req.target)
    card = {**card, "card_id": f"{art.ref}/{card['index']}"}
    require_tensor_inputs(card)
    device = _on(req.device, card["device"])
    args, kwargs, _, synthesized = sample_call(art, card, 0, device=device)
    args = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]

    def call():
        with torch.no_grad():
            return run_card(card, args, kwargs)

    extra = {"card": card, "synthesized": synthesized}
    return call, device, f"one call of {card['op']} on the card's first stored sample (no autograd)", False, extra


def _profile_capture(req: ProfileRequest, repo: Repository) -> tuple[Any, str, str, bool, dict[str, Any]]:
    art = repo.open("captures", req.target)
    device = _on(req.device, art.manifest.get("environment", {}).get("device", "cpu"))
    loaded = LoadedCapture(art, device=device)
    args, kwargs = loaded.inputs()
    grad = bool(art.manifest["grad_enabled"])
    module, strategy, _, _ = loaded.with_strategy(req.strategy, False, lambda m: m)

    def call():
        with torch.set_grad_enabled(grad):
            return module(*args, **kwargs)

    what = (f"one forward of {art.manifest['class_path']} ({strategy} strategy) on the captured inputs, "
            f"in {'train' if art.manifest['training'] else 'eval'} mode")
    return call, device, what, grad, {"synthesized": loaded.synthesized}


def _profile_candidate(req: ProfileRequest, repo: Repository, ctx: ToolContext) -> ProfileResult:
    """Candidates are untrusted code: they are timed inside the sandbox, never in this process."""
    from modulelens.kernels.backends.base import default_build_dir
    from modulelens.kernels.candidates import load_candidate
    from modulelens.sandbox.pool import pool

    art, src = load_candidate(repo, req.target)
    card_id = art.manifest["target"]["card_id"]
    task = {"kind": "time_candidate", "repo": str(repo.root), "card_id": card_id, "candidate": src.model_dump(),
            "build_dir": str(default_build_dir()), "device": req.device, "min_run_time": req.min_run_time,
            "warmup": req.warmup}
    ctx.progress(0, 1, f"timing {art.ref} in the sandbox")
    result = pool().run(task, timeout=900)
    if "crashed" in result:
        raise ModuleLensError(f"the candidate's sandbox worker {result['crashed']} while timing it",
                              "validate it first: validate-kernel " + art.ref)
    if "error" in result:
        raise ModuleLensError(result["error"], result.get("hint"))
    card = result["card"]
    timing = Timing.model_validate(result["timing"])
    notes = ["timed in the sandbox worker; run profile on the card for the eager operator's breakdown"]
    res = ProfileResult(**timing.model_dump(), target=art.ref, target_kind="candidate",
                        what=f"one call of candidate {art.ref} ({src.backend}) on card {card_id}'s first sample",
                        grad_enabled=False, notes=notes)
    if card["kind"] == "memory" and card["bytes_per_call"]:
        bw = copy_bandwidth(timing.device)
        res.bytes_moved = card["bytes_per_call"]
        res.achieved_bytes_per_s = card["bytes_per_call"] / timing.median_s
        res.copy_bytes_per_s = bw["bytes_per_s"]
        res.roofline_fraction = res.achieved_bytes_per_s / bw["bytes_per_s"]
    ctx.progress(1, 1, "done")
    return res


def _is_candidate(repo: Repository, target: str) -> bool:
    from modulelens.errors import InvalidName
    from modulelens.repo import parse_ref

    try:
        return bool(repo.versions("candidates", parse_ref(target).name))
    except InvalidName:
        return False


def profile(req: ProfileRequest, ctx: ToolContext) -> ProfileResult:
    repo = Repository(ctx.repo_root)
    if not is_card_id(req.target) and _is_candidate(repo, req.target):
        return _profile_candidate(req, repo, ctx)
    kind = "card" if is_card_id(req.target) else "capture"
    call, device, what, grad, extra = (_profile_card if kind == "card" else _profile_capture)(req, repo)
    ctx.progress(0, 3, f"timing {req.target}")
    timing = time_callable(call, device, min_run_time=req.min_run_time, warmup=req.warmup)
    notes = []
    if extra.get("synthesized"):
        notes.append("some inputs were synthesised from stored statistics (shape-only capture)")
    result = ProfileResult(**timing.model_dump(), target=req.target, target_kind=kind, what=what, grad_enabled=grad,
                           notes=notes)
    if req.breakdown:
        ctx.progress(1, 3, "torch.profiler breakdown")
        result.breakdown, result.peak_memory_bytes, result.peak_memory_method = profile_breakdown(call, device)
    card = extra.get("card")
    if card is not None:
        if card["kind"] == "memory" and card["bytes_per_call"]:
            ctx.progress(2, 3, "machine copy bandwidth")
            bw = copy_bandwidth(device)
            result.bytes_moved = card["bytes_per_call"]
            result.achieved_bytes_per_s = card["bytes_per_call"] / timing.median_s
            result.copy_bytes_per_s = bw["bytes_per_s"]
            result.roofline_fraction = result.achieved_bytes_per_s / bw["bytes_per_s"]
            if result.roofline_fraction > 1:
                notes.append("achieved bandwidth exceeds the memory copy bandwidth: the working set "
                             f"({card['bytes_per_call']} bytes) fits in cache")
        elif card["kind"] == "compute":
            notes.append("compute-bound operator: a bandwidth roofline does not apply")
    ctx.progress(3, 3, "done")
    return result


def _fmt_s(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s * 1e6:.2f} us" if s < 1e-3 else f"{s * 1e3:.3f} ms" if s < 1 else f"{s:.3f} s"


def _render(r: ProfileResult):
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=escape(f"profile of {r.target}"), show_header=False, title_justify="left")
    t.add_column(style="bold")
    t.add_column()
    t.add_row("timed call", escape(r.what))
    t.add_row("median", f"{_fmt_s(r.median_s)} per call (p20 {_fmt_s(r.p20_s)}, p80 {_fmt_s(r.p80_s)})")
    t.add_row("runs", f"{r.runs} calls in {r.samples} samples after {r.warmup} warm-up calls")
    t.add_row("timer", escape(r.timer))
    t.add_row("device", f"{escape(r.device)}, {r.threads} threads, {escape(r.cache)}, autograd {'on' if r.grad_enabled else 'off'}")
    if r.peak_memory_bytes is not None:
        t.add_row("peak memory", f"{r.peak_memory_bytes / 2**20:.2f} MiB ({escape(r.peak_memory_method or '')})")
    if r.roofline_fraction is not None:
        t.add_row("bandwidth", f"{r.bytes_moved} bytes per call -> {r.achieved_bytes_per_s / 1e9:.2f} GB/s = "
                  f"{r.roofline_fraction:.1%} of this machine's copy bandwidth ({r.copy_bytes_per_s / 1e9:.2f} GB/s)")
    for n in r.notes:
        t.add_row("[yellow]note[/]", escape(n))
    if not r.breakdown:
        return t
    b = Table(title="top operators by self time (torch.profiler, per call)", title_justify="left")
    for col in ("op", "input shapes", "calls", "self time", "share"):
        b.add_column(col)
    for o in r.breakdown:
        b.add_row(escape(o.op), escape(o.input_shapes), f"{o.calls_per_run:g}", _fmt_s(o.self_s_per_run), f"{o.share:.1%}")
    from rich.console import Group

    return Group(t, b)


TOOL = register(
    Tool(
        name="profile",
        request=ProfileRequest,
        result=ProfileResult,
        fn=profile,
        summary="Time a capture or an operator card with an established timer (warm-up, median, p20/p80, runs, "
        "threads, cache state), with a torch.profiler breakdown, peak memory and, for memory-bound cards, the "
        "achieved fraction of this machine's copy bandwidth.",
        render=_render,
    )
)
