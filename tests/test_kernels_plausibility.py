"""Speedups a validation report flags as implausible (modulelens.validation.plausibility): measured
numbers are fabricated here, so each rule is checked without timing anything."""

from __future__ import annotations

from modulelens.validation.plausibility import speedup_flags
from modulelens.timing import Timing


def _timing(median_s: float) -> Timing:
    return Timing(median_s=median_s, p20_s=median_s * 0.95, p80_s=median_s * 1.05, runs=100, samples=100,
                  warmup=3, timer="fabricated", device="cpu", threads=1, cache="warm")


def test_ordinary_speedups_raise_no_flag():
    assert speedup_flags(_timing(2e-5), _timing(1e-5), _timing(1.5e-5)) == []
    assert speedup_flags(_timing(2e-5), _timing(1e-5)) == []


def test_a_speedup_of_674_over_a_broken_compile_baseline_is_flagged():
    """The case from issue 13: a candidate 1.3x faster than eager but 674x faster than
    torch.compile, whose baseline was ~520x slower than eager."""
    eager, cand = _timing(1.3e-5), _timing(1e-5)
    compiled = _timing(674e-5)
    flags = speedup_flags(eager, cand, compiled)
    text = "\n".join(flags)
    assert "674.0x faster than torch.compile" in text
    assert "compile baseline" in text and "518.5x slower than eager" in text
    assert "speedup_vs_eager" in text  # says which number to trust instead
    assert not any("than eager" in f and "faster" in f for f in flags)  # 1.3x vs eager is believable


def test_beyond_belief_speedup_vs_eager_is_flagged():
    flags = speedup_flags(_timing(1e-3), _timing(1e-5))
    assert flags == ["suspicious: 100.0x faster than eager"]


def test_a_fast_candidate_and_a_sane_compile_baseline_flag_both_speedups():
    flags = speedup_flags(_timing(1e-3), _timing(1e-5), _timing(8e-4))
    assert "suspicious: 100.0x faster than eager" in flags
    assert any("80.0x faster than torch.compile" in f for f in flags)
    assert not any("compile baseline" in f for f in flags)
