"""Flags for measured speedups that are too good to be believed, for a validation report's ``flags``.

A kernel for one operator rarely beats eager PyTorch by more than an order of magnitude, and a
``torch.compile`` baseline that runs several times slower than eager measures the compiler's
overhead (guards, recompiles, a cold cache), not a fair target: a speedup against it says little.
These rules are pure functions of the measured medians, so they can be checked on made-up numbers.
"""

from __future__ import annotations

from modulelens.timing import Timing

MAX_BELIEVABLE_SPEEDUP = 10.0  # candidate vs eager or vs torch.compile
MAX_COMPILE_SLOWDOWN = 3.0  # torch.compile median / eager median beyond which the baseline is broken


def speedup_flags(eager: Timing, candidate: Timing, compiled: Timing | None = None) -> list[str]:
    """One line per implausible finding in these medians (empty when all look believable):
    a speedup over eager or over ``compiled`` beyond :data:`MAX_BELIEVABLE_SPEEDUP`, and a
    ``compiled`` baseline more than :data:`MAX_COMPILE_SLOWDOWN` times slower than eager."""
    flags: list[str] = []
    vs_eager = eager.median_s / candidate.median_s
    if vs_eager > MAX_BELIEVABLE_SPEEDUP:
        flags.append(f"suspicious: {vs_eager:.1f}x faster than eager")
    if compiled is None:
        return flags
    vs_compile = compiled.median_s / candidate.median_s
    if vs_compile > MAX_BELIEVABLE_SPEEDUP:
        flags.append(f"suspicious: {vs_compile:.1f}x faster than torch.compile")
    slowdown = compiled.median_s / eager.median_s
    if slowdown > MAX_COMPILE_SLOWDOWN:
        flags.append(
            f"compile baseline looks broken: torch.compile of the operator ran {slowdown:.1f}x slower than eager "
            f"(compiler overhead, not a kernel), so speedup_vs_compile ({vs_compile:.1f}x) means little; "
            f"judge the candidate by speedup_vs_eager ({vs_eager:.2f}x)")
    return flags
