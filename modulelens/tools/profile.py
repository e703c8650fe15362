"""profile: time a capture or an operator card fairly and explain every number."""

from __future__ import annotations

from pydantic import Field

from modulelens.profiling.targets import ProfileOptions, ProfileResult, profile_target
from modulelens.registry import Tool, ToolContext, register
from modulelens.repo import Repository


class ProfileRequest(ProfileOptions):
    target: str = Field(description="A capture reference (blk, blk:v2), an operator card id (blk/0) or a candidate id "
                        "(blk.card6:v1, timed in the sandbox).",
                        json_schema_extra={"cli": "argument"})


def profile(req: ProfileRequest, ctx: ToolContext) -> ProfileResult:
    return profile_target(Repository(ctx.repo_root), req.target, req, ctx.progress)


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
