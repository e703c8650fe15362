"""The pieces module and card verdicts rest on, tested alone: streamed comparisons, the float64
oracle rule, fresh inputs and parameters, the denial's operator list, its Landlock and seccomp
layers (in a subprocess), the memory-map readers, and what a refused validation becomes."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from modulelens.errors import ModuleLensError
from modulelens.validation import compare
from modulelens.validation.compare import compare_output, oracle_errors, same_bits, within_oracle
from modulelens.validation.inputs import fresh_inputs, fresh_state


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of 7 elements, so every comparison below crosses chunk boundaries."""
    monkeypatch.setattr(compare, "CHUNK_ELEMENTS", 7)


def test_streamed_comparison_finds_one_bad_element_in_the_last_chunk(small_chunks):
    want = torch.linspace(-1, 1, 50)
    got = want.clone()
    assert compare_output(got, want, None, None) == (True, "")
    got[49] += 1e-3
    ok, detail = compare_output(got, want, None, None)
    assert not ok and detail.startswith("1 of 50 values outside tolerance"), detail


def test_streamed_comparison_sees_nan_and_infinities_in_any_chunk(small_chunks):
    want = torch.arange(30, dtype=torch.float32)
    got = want.clone()
    got[20] = float("nan")
    assert compare_output(got, want, None, None) == (False, "1 NaN where the reference has a number, first at [20]: "
                                                            "expected 20, got NaN (memory the kernel did not write?)")
    want2, got2 = want.clone(), want.clone()
    want2[3] = got2[3] = float("inf")
    got2[25] = float("-inf")
    assert compare_output(got2, want2, None, None)[1] == ("infinities differ from the reference in sign or place, "
                                                          "first at [25]: expected 25, got -inf")
    assert same_bits(torch.tensor([float("nan")] * 20), torch.tensor([float("nan")] * 20))
    assert not same_bits(torch.zeros(20), torch.cat([torch.zeros(19), torch.ones(1)]))


def test_non_finite_values_must_match_exactly_and_the_first_offender_is_named(small_chunks):
    want = torch.zeros(4, 6)
    want[3] = float("nan")  # e.g. a fully masked softmax row
    want[1, 2], want[2, 5] = float("inf"), float("-inf")
    assert compare_output(want.clone(), want, None, None) == (True, "")
    number_for_nan = want.clone()
    number_for_nan[3, 1] = 0.0
    assert compare_output(number_for_nan, want, None, None) == (
        False, "1 NaN of the reference missing, first at [3, 1]: expected NaN, got 0")
    flipped = want.clone()
    flipped[1, 2] = float("-inf")
    assert compare_output(flipped, want, None, None)[1].endswith("first at [1, 2]: expected inf, got -inf")
    finite_for_inf = want.clone()
    finite_for_inf[2, 5] = -3.4e38
    assert not compare_output(finite_for_inf, want, None, None)[0]
    nan_for_zero = torch.zeros(4, 6)
    nan_for_zero[3] = float("nan")
    assert compare_output(nan_for_zero, torch.zeros(4, 6), None, None)[1].startswith(
        "6 NaN where the reference has a number, first at [3, 0]: expected 0, got NaN")
    # finite values still within tolerance around the non-finite ones
    off = want.clone()
    off[0, 0] = 1e-3
    assert compare_output(off, want, None, None)[1].startswith("1 of 16 values outside tolerance")


def test_nan_in_eager_rounding_sensitivity_gives_no_room(small_chunks):
    want = torch.ones(10)
    got = want.clone()
    got[4] = 2.0
    noise = torch.full((10,), float("nan"))
    assert not compare_output(got, want, None, None, noise=noise)[0]


def test_zeros_cannot_pass_for_a_small_output(small_chunks):
    want = torch.full((40,), 1e-6)
    assert not compare_output(torch.zeros(40), want, None, None)[0]


def test_the_oracle_accepts_what_is_closer_to_float64_than_eager_and_nothing_else():
    oracle = torch.linspace(-2, 2, 100, dtype=torch.float64)
    eager = (oracle + 1e-4 * torch.sin(torch.arange(100.0, dtype=torch.float64))).float()  # eager is off by 1e-4
    better = oracle.float()
    ok, mine, eagers = within_oracle(better, eager, oracle)
    assert ok and mine.max_abs < 1e-6 < 5e-5 < eagers.max_abs
    wrong = (oracle * 1.01).float()
    assert not within_oracle(wrong, eager, oracle)[0]
    with_nan = better.clone()
    with_nan[0] = float("nan")
    assert not within_oracle(with_nan, eager, oracle)[0]
    assert math.isinf(oracle_errors(with_nan, oracle).max_abs)
    assert not within_oracle(better.double(), eager.double(), oracle)[0]  # a float64 eager leaves no room
    ok, entry, detail = compare.judged_by_oracle(with_nan, eager, oracle, "eval, captured inputs", 0, "1 NaN")
    assert not ok and entry.candidate_max_abs is None and "still rejected" in detail  # JSON has no infinity
    from modulelens.validation.report import ValidationReport

    report = ValidationReport(verdict="rejected", correct=False, reason="", stage="check", backend="cpp", accuracy=[entry])
    assert ValidationReport.model_validate_json(report.model_dump_json()).accuracy[0] == entry


def test_fresh_inputs_are_deterministic_and_drawn_in_chunks(monkeypatch):
    from modulelens.validation import inputs

    t = torch.empty(3, 5)
    a, _ = fresh_inputs([t], {}, 4, "normal")
    g = torch.Generator().manual_seed(4)
    assert torch.equal(a[0], torch.randn(15, generator=g, dtype=torch.float64).float().view(3, 5))
    monkeypatch.setattr(inputs, "CHUNK_ELEMENTS", 4)
    for dist in ("normal", "uniform", "heavy", "special"):
        x, _ = fresh_inputs([t.t()], {}, 1, dist)
        y, _ = fresh_inputs([t.t()], {}, 1, dist)
        assert torch.equal(x[0], y[0]) and x[0].stride() == t.t().stride() and bool(torch.isfinite(x[0]).all())


def test_the_varied_arguments_of_a_card_are_named_as_the_operator_names_them():
    from modulelens.validation.inputs import floating_names

    schema = torch.ops.aten.native_layer_norm.default._schema
    x, w, b = torch.zeros(2, 4), torch.ones(4), torch.zeros(4)
    names = [a.name for a in schema.arguments]
    assert floating_names([x, [4], w, b, 1e-5], {}, names) == ["input", "weight", "bias"]
    assert floating_names([x, torch.arange(3)], {"scale": w}) == ["argument 0", "scale"]


def test_fresh_parameters_break_the_symmetries_of_a_fresh_module():
    ln = torch.nn.LayerNorm(64)
    bn = torch.nn.BatchNorm1d(8)
    head = torch.nn.Linear(4, 4, bias=False)
    state = {"ln.weight": ln.weight.detach(), "ln.bias": ln.bias.detach(), "bn.running_var": bn.running_var,
             "bn.running_mean": bn.running_mean, "bn.num_batches_tracked": bn.num_batches_tracked,
             "mask": torch.tril(torch.ones(4, 4)), "a.weight": head.weight.detach(), "b.weight": head.weight.detach()}
    params = {"ln.weight", "ln.bias", "a.weight", "b.weight"}
    new, varied, kept = fresh_state(state, params, seed=3)
    assert (new["ln.weight"] < 0).any() and new["ln.weight"].std() > 0.3  # random signs and scales
    assert new["ln.bias"].abs().min() > 0  # a zero bias becomes non-zero
    assert (new["bn.running_var"] > 0).all() and not torch.equal(new["bn.running_var"], bn.running_var)
    assert new["b.weight"] is new["a.weight"]  # one value for a tensor shared under two names
    assert torch.equal(new["mask"], state["mask"]) and new["bn.num_batches_tracked"] is bn.num_batches_tracked
    assert set(varied) == {"ln.weight", "ln.bias", "bn.running_var", "bn.running_mean", "a.weight", "b.weight"}
    assert any(k.startswith("mask") for k in kept) and any(k.startswith("bn.num_batches_tracked") for k in kept)
    again, _, _ = fresh_state(state, params, seed=3)
    assert torch.equal(again["ln.weight"], new["ln.weight"])


def test_the_denial_denies_computing_operators_and_nothing_a_constructor_needs():
    from modulelens.validation.poison import computes

    for name in ("aten::mul.Tensor", "aten::_softmax", "aten::cat", "aten::addmm", "aten::convolution",
                 "prims::exp", "aten::native_layer_norm"):
        assert computes(name), name
    for name in ("aten::empty.memory_format", "aten::view", "aten::transpose.int", "aten::copy_", "aten::uniform_",
                 "aten::normal_", "aten::arange", "aten::fill_.Scalar", "aten::_to_copy", "aten::as_strided"):
        assert not computes(name), name


def test_memory_maps_are_read_for_code_and_built_libraries(tmp_path):
    from pathlib import Path

    from modulelens.validation.evidence import built_library_symbols, mapped_libraries
    from modulelens.validation.poison import executable_ranges

    lib = tmp_path / "scratch" / "ext.so"
    lib.parent.mkdir()
    lib.write_bytes(b"not really an ELF file")
    maps = (f"7f00-7f10 r-xp 00000000 fe:00 11 /site/numpy/_core/umath.so\n"
            f"7f10-7f20 ---p 00000000 fe:00 11 /site/numpy/_core/umath.so\n"
            f"7f20-7f30 r-xp 00000000 fe:00 {os.stat(lib).st_ino} {lib}\n"
            f"7f30-7f40 r-xp 00000000 fe:00 99 /usr/lib/libc.so.6\n")
    assert executable_ranges(maps, ["/site/numpy"]) == [(0x7F00, 0x7F10, "/site/numpy/_core/umath.so")]
    assert mapped_libraries(maps, [Path(tmp_path / "scratch")]) == {str(lib): os.stat(lib).st_ino}
    assert built_library_symbols({str(lib): os.stat(lib).st_ino}) == []  # no symbols to read, nothing flagged
    swapped = built_library_symbols({str(lib): os.stat(lib).st_ino + 1})
    assert swapped == ["ext.so was replaced on disk after it was loaded (its symbols cannot be checked)"]


def test_paths_beneath_except_leaves_out_only_the_denied_hierarchies(tmp_path):
    from modulelens.sandbox.containment import paths_beneath_except

    for p in ("site/numpy/core", "site/torch", "site/six.py", "other"):
        (tmp_path / p).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / p).mkdir() if "." not in p else (tmp_path / p).write_text("")
    (tmp_path / "site" / "link").symlink_to(tmp_path / "site" / "numpy")
    got = paths_beneath_except([str(tmp_path)], [str(tmp_path / "site" / "numpy")])
    assert sorted(got) == sorted([str(tmp_path / "other"), str(tmp_path / "site" / "six.py"),
                                  str(tmp_path / "site" / "torch")])


def test_the_denial_layers_hold_in_a_process_of_their_own(tmp_path):
    """A further Landlock layer leaves a folder unreadable and a sibling readable; the stacked
    seccomp filter refuses PROT_EXEC from mprotect but not PROT_READ, and anonymous executable pages
    from mmap but not anonymous data pages."""
    from modulelens.sandbox.containment import landlock_abi

    if landlock_abi() < 1 or sys.platform != "linux":
        pytest.skip("needs Landlock")
    (tmp_path / "denied").mkdir()
    (tmp_path / "denied" / "f").write_text("secret")
    (tmp_path / "open").mkdir()
    (tmp_path / "open" / "f").write_text("fine")
    script = textwrap.dedent(f"""
        import ctypes, mmap, sys
        from modulelens.sandbox.containment import readable_roots, restrict_reading
        from modulelens.sandbox.seccomp import install_filter, machine_arch, no_exec_program
        layer = restrict_reading(readable_roots([{str(tmp_path)!r}]), [{str(tmp_path / "denied")!r}])
        assert layer.in_force, layer
        assert open({str(tmp_path / "open" / "f")!r}).read() == "fine"
        try:
            open({str(tmp_path / "denied" / "f")!r}).read()
            sys.exit("read a denied file")
        except PermissionError:
            pass
        assert install_filter(no_exec_program(machine_arch()))[0]
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        page = mmap.mmap(-1, 4096)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(page))
        assert libc.mprotect(addr, 4096, 1 | 2) == 0
        assert libc.mprotect(addr, 4096, 1 | 4) == -1 and ctypes.get_errno() == 1  # EPERM
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        assert libc.mmap(None, 4096, 1 | 2 | 4, 0x02 | 0x20, -1, 0) == 2**64 - 1  # no fresh code: MAP_FAILED
        assert ctypes.get_errno() == 1
        assert libc.mmap(None, 4096, 1 | 2, 0x02 | 0x20, -1, 0) != 2**64 - 1  # data pages still come
        print("held")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "held" in done.stdout, done.stderr[-2000:]


def test_a_refused_validation_is_an_error_naming_the_limit_not_an_internal_error():
    from modulelens.validation.messages import CandidateLimits, memory_refusal, out_of_memory
    from modulelens.validation.sandboxed import validation_report

    refusal = memory_refusal(CandidateLimits(memory_limit_mb=6144), "a candidate of capture big:v1", 256 * 2**20)
    with pytest.raises(ModuleLensError) as e:
        validation_report(refusal, "module")
    assert "6144 MB" in str(e.value) and "256 MiB" in str(e.value)
    assert e.value.rendered("cli")[1] == "raise it with --memory-limit-mb 12288", e.value.rendered("cli")
    assert out_of_memory(MemoryError()) and out_of_memory(OSError(12, "Cannot allocate memory"))
    assert out_of_memory(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 9 bytes"))
    assert not out_of_memory(RuntimeError("shape mismatch"))


def test_warnings_say_when_the_oracle_accepted_and_when_custom_was_not_confirmed():
    from modulelens.validation.advice import report_warnings
    from modulelens.validation.report import Accuracy, Denial, ValidationReport

    report = ValidationReport(verdict="wrapper", correct=True, reason="", stage="done", backend="module",
                              denial=Denial(outcome="inconclusive", detail="it could not be built there: X",
                                            denied="..."),
                              accuracy=[Accuracy(case="eval, captured inputs", output=0, candidate_max_abs=1e-7,
                                                 eager_max_abs=3e-4, candidate_rel_l2=1e-8, eager_rel_l2=1e-4,
                                                 allowed_multiple=4, accepted=True)])
    text = " | ".join(report_warnings(report))
    assert "not confirmed to compute by itself: it could not be built there" in text, text
    assert "eager itself is off by up to 0.0003" in text, text
