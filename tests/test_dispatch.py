"""Kernel packs without builds: exact call patterns, the pack file's checks, and guarded dispatch.

Entries here carry small Python kernels (the ``triton`` backend loads a Python module; these
kernels launch nothing), so every case runs in milliseconds; the C++ template kernels of the
example transformer are exercised in test_pack_tinyformer.py.
"""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import modulelens
from modulelens.capture import class_path
from modulelens.dispatch.pack import (
    ModuleInit,
    PackContent,
    PackEntry,
    PackLoadError,
    current_environment,
    read_pack,
    write_pack,
)
from modulelens.dispatch.patterns import call_key, describe_call, difference, pattern_key
from modulelens.validation.report import ValidationReport

SOFTMAX = "aten._safe_softmax.default"
# A stand-in kernel: the same values as eager (softmax over rows without -inf), and a mark that it ran.
KERNEL = """
import torch
CALLS = []
def forward(x, dim):
    CALLS.append(tuple(x.shape))
    return torch.ops.aten._softmax(x, dim, False)
"""
RAISING = """
def forward(x, dim):
    raise RuntimeError("kernel exploded")
"""
MECHANISMS = ["library", "mode"]


def _interval(speedup: float | None) -> list[float] | None:
    return [speedup * 0.95, speedup * 1.05] if speedup is not None else None


def _report(speedup: float | None = 2.0, correct: bool = True) -> ValidationReport:
    return ValidationReport(verdict="custom" if correct else "rejected", correct=correct, reason="test entry",
                            stage="done", backend="triton", speedup_vs_eager=speedup,
                            speedup_interval=_interval(speedup), timing_status="ok" if speedup else None)


def _op_entry(x: torch.Tensor, source: str = KERNEL, *, grad: bool = True, speedup: float | None = 2.0,
              cid: str = "t.card0:v1") -> PackEntry:
    return PackEntry(candidate_id=cid, kind="op", target="t:v1/0", op=SOFTMAX,
                     pattern=describe_call([x, -1], {}, grad_enabled=grad), backend="triton", source=source,
                     source_sha256="test", report=_report(speedup), speedup_vs_eager=speedup,
                     speedup_interval=_interval(speedup))


def _write(path, entries: list[PackEntry], **env_changes) -> str:
    env = current_environment({e.backend for e in entries}).model_copy(update=env_changes)
    write_pack(path, PackContent(environment=env, entries=entries))
    return str(path)


def _softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.ops.aten._safe_softmax(x, -1)


# ---------------------------------------------------------------------------------------------
# Patterns


@pytest.mark.parametrize("args, kwargs", [
    ([torch.randn(2, 3), -1], {}),
    ([torch.randn(4, 3).t(), [1, 2], 1e-5, None, True], {"dtype": torch.float32}),
    ([[torch.zeros(2), torch.ones(3, dtype=torch.float64)], "mean"], {"out": torch.empty(0)}),
])
def test_a_calls_key_is_the_key_of_its_pattern(args, kwargs):
    pattern = describe_call(args, kwargs, grad_enabled=torch.is_grad_enabled())
    assert call_key(args, kwargs) == pattern_key(pattern)
    assert pattern_key(type(pattern).model_validate(json.loads(pattern.model_dump_json()))) == pattern_key(pattern)


def test_int_float_and_bool_arguments_do_not_match_each_other():
    keys = {call_key([v], {}) for v in (1, 1.0, True)}
    assert len(keys) == 3


def test_difference_names_the_first_mismatch():
    x = torch.randn(2, 3)
    want = pattern_key(describe_call([x, -1], {}, grad_enabled=True))
    assert "shape [2, 4]" in difference(call_key([torch.randn(2, 4), -1], {}), want)
    assert "dtype float64" in difference(call_key([x.double(), -1], {}), want)
    assert "argument 1: 0" in difference(call_key([x, 0], {}), want)
    with torch.no_grad():
        assert "grad mode off" in difference(call_key([x, -1], {}), want)


# ---------------------------------------------------------------------------------------------
# The pack file


def test_a_tampered_pack_never_loads(tmp_path):
    path = _write(tmp_path / "p.pack", [_op_entry(torch.randn(4, 8))])
    assert read_pack(path).content.entries[0].op == SOFTMAX
    text = open(path).read()
    open(path, "w").write(text.replace("CALLS.append", "CALLS .append"))
    with pytest.raises(PackLoadError, match="modified after it was written"):
        read_pack(path)
    with pytest.raises(PackLoadError, match="modified after it was written"):
        modulelens.use_pack(path)


def test_a_pack_from_another_torch_version_refuses_to_load_unless_told(tmp_path):
    path = _write(tmp_path / "p.pack", [_op_entry(torch.randn(4, 8))], torch="1.13.0")
    with pytest.raises(PackLoadError, match=r"torch 1\.13\.0, this is torch") as e:
        read_pack(path)
    assert "allow_env_mismatch" in e.value.hint
    loaded = read_pack(path, allow_env_mismatch=True)
    assert loaded.environment_notes and "1.13.0" in loaded.environment_notes[0]


def test_a_pack_from_another_device_refuses_to_load(tmp_path):
    path = _write(tmp_path / "p.pack", [_op_entry(torch.randn(4, 8))], device_name="Some Other CPU [0000]")
    with pytest.raises(PackLoadError, match="Some Other CPU"):
        read_pack(path)


def test_expected_sha256_and_non_packs(tmp_path):
    path = _write(tmp_path / "p.pack", [_op_entry(torch.randn(4, 8))])
    sha = json.loads(open(path).read())["sha256"]
    assert read_pack(path, expect_sha256=sha).sha256 == sha
    with pytest.raises(PackLoadError, match="not the expected"):
        read_pack(path, expect_sha256="0" * 64)
    (tmp_path / "x.pack").write_text('{"hello": 1}')
    with pytest.raises(PackLoadError, match="not a modulelens pack"):
        read_pack(tmp_path / "x.pack")
    with pytest.raises(PackLoadError, match="does not exist"):
        read_pack(tmp_path / "missing.pack")


# ---------------------------------------------------------------------------------------------
# Guarded dispatch


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_only_the_exact_validated_call_reaches_the_kernel(tmp_path, mechanism):
    x = torch.randn(4, 8)
    path = _write(tmp_path / "p.pack", [_op_entry(x)])
    others = {
        "shape": torch.randn(4, 16),
        "dtype": x.double(),
        "strides": torch.randn(8, 4).t(),  # same shape [4, 8], transposed strides
        "device": torch.empty(4, 8, device="meta"),
    }
    eager = {k: _softmax(v) for k, v in others.items()}
    with modulelens.use_pack(path, mechanism=mechanism) as pack:
        hit = _softmax(x)
        got = {k: _softmax(v) for k, v in others.items()}
        with torch.no_grad():
            no_grad = _softmax(x)
    assert torch.allclose(hit, _softmax(x))
    for k, v in got.items():
        assert v.shape == eager[k].shape and v.dtype == eager[k].dtype and v.device == eager[k].device
        if v.device.type != "meta":
            assert torch.equal(v, eager[k]), k
    assert torch.equal(no_grad, _softmax(x))
    report = pack.report()
    entry = report.entries[0]
    assert report.mechanism == mechanism
    assert (entry.hits, entry.fallbacks) == (1, 5) and (report.hits, report.fallbacks) == (1, 5)
    reasons = " | ".join(entry.fallback_reasons)
    for word in ("shape [4, 16]", "dtype float64", "strides [1, 4]", "device meta", "grad mode off"):
        assert word in reasons, reasons
    _softmax(x)  # outside the block nothing is intercepted any more
    assert pack.report().hits == 1


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_a_kernel_that_raises_falls_back_to_eager_and_is_reported(tmp_path, mechanism):
    x = torch.randn(4, 8)
    path = _write(tmp_path / "p.pack", [_op_entry(x, RAISING)])
    with modulelens.use_pack(path, mechanism=mechanism) as pack:
        out = _softmax(x)
    assert torch.equal(out, _softmax(x))
    entry = pack.report().entries[0]
    assert entry.hits == 0 and entry.fallbacks == 1
    assert list(entry.fallback_reasons) == ["kernel raised RuntimeError: kernel exploded"]


def test_only_entries_that_surely_beat_eager_are_dispatched(tmp_path):
    x = torch.randn(4, 8)
    slow = _op_entry(x, speedup=0.8)
    unsure = _op_entry(x, speedup=1.2, cid="t.card0:v2").model_copy(update={"speedup_interval": [0.9, 1.6]})
    assert "95% interval is 0.90x..1.60x (the lower bound must be above 1" in unsure.skip_reason()
    assert unsure.model_copy(update={"forced": True}).skip_reason() is None  # packed with force: used anyway
    path = _write(tmp_path / "p.pack", [slow])
    with modulelens.use_pack(path) as pack:
        _softmax(x)
    entry = pack.report().entries[0]
    assert not entry.dispatched and entry.hits == 0 and "interval is 0.76x..0.84x" in entry.skip_reason
    assert not torch._C._dispatch_has_kernel_for_dispatch_key("aten::_safe_softmax",
                                                               torch._C.DispatchKey.ADInplaceOrView)


class _Attn(nn.Module):
    def forward(self, x):
        return _softmax(x)


def test_apply_pack_dispatches_only_inside_the_models_forward(tmp_path):
    x = torch.randn(4, 8)
    path = _write(tmp_path / "p.pack", [_op_entry(x)])
    model = _Attn()
    applied = modulelens.apply_pack(model, path)
    try:
        model(x)
        _softmax(x)  # outside the model: eager, not counted
        model(x)
    finally:
        applied.remove()
    assert applied.report().hits == 2 and applied.report().fallbacks == 0
    assert not torch._C._dispatch_has_kernel_for_dispatch_key("aten::_safe_softmax",
                                                               torch._C.DispatchKey.ADInplaceOrView)


# ---------------------------------------------------------------------------------------------
# Module entries


class Scale(nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.lin = nn.Linear(n, n)

    def forward(self, x):
        return self.lin(x) * 2


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Scale(4)

    def forward(self, x):
        return self.inner(x)


MODEL_NEW = """
import torch
from torch import nn
CALLS = []
class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.lin = nn.Linear(n, n)
    def forward(self, x):
        CALLS.append(1)
        return torch.addmm(self.lin.bias, x, self.lin.weight.t()) * 2
"""


def _module_entry(x: torch.Tensor, *, training: bool = False) -> PackEntry:
    return PackEntry(candidate_id="s.module:v1", kind="module", target="s:v1", class_path=class_path(Scale),
                     module_path="inner", pattern=describe_call([x], {}, grad_enabled=False, training=training),
                     backend="module", entry="ModelNew", source=MODEL_NEW, source_sha256="test",
                     init=ModuleInit(args=[4], kwargs={}), report=_report(), speedup_vs_eager=2.0,
                     speedup_interval=_interval(2.0))


def test_a_module_entry_replaces_the_modules_forward_behind_its_guard(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(3, 4)
    path = _write(tmp_path / "p.pack", [_module_entry(x)])
    model = Outer().eval()
    with torch.no_grad():
        want = model(x)
        applied = modulelens.apply_pack(model, path)
        state = torch.random.get_rng_state()
        got = model(x)
        assert torch.equal(state, torch.random.get_rng_state()), "building ModelNew must not move the RNG"
        model(torch.randn(5, 4))  # another shape
        model.train()
        model(x)  # training mode
    model.eval()
    model(x)  # grad mode on
    report = applied.report()
    applied.remove()
    assert torch.allclose(got, want, atol=1e-6)
    assert applied.patched == 1
    entry = report.entries[0]
    assert entry.hits == 1 and entry.fallbacks == 3, entry
    reasons = " | ".join(entry.fallback_reasons)
    assert "shape [5, 4]" in reasons and "training=True" in reasons and "grad mode on" in reasons
    assert "forward" not in model.inner.__dict__


def test_use_pack_patches_models_called_inside_the_block(tmp_path):
    x = torch.randn(3, 4)
    path = _write(tmp_path / "p.pack", [_module_entry(x)])
    model = Outer().eval()
    with torch.no_grad(), modulelens.use_pack(path) as pack:
        model(x)
        model(x)
    assert pack.report().hits == 2
    assert "forward" not in model.inner.__dict__


# ---------------------------------------------------------------------------------------------
# Front ends


def test_pack_needs_validated_candidates(cli, tmp_path):
    code, _, r = cli("pack", "--out", tmp_path / "p.pack", "--repo", tmp_path, "--json")
    assert code == 2  # a usage error: at least one candidate
    code, _, r = cli("pack", "nothing.card0:v1", "--out", tmp_path / "p.pack", "--repo", tmp_path, "--json")
    assert code == 2 and "nothing.card0" in r.output


def test_run_refuses_a_tampered_pack(cli, tmp_path):
    path = _write(tmp_path / "p.pack", [_op_entry(torch.randn(4, 8))])
    open(path, "a").write(" ")  # whitespace after the JSON is not content: still loads
    assert read_pack(path)
    data = json.loads(open(path).read())
    data["content"]["entries"][0]["speedup_vs_eager"] = 50.0
    open(path, "w").write(json.dumps(data))
    script = tmp_path / "s.py"
    script.write_text("print('hello')\n")
    code, _, r = cli("run", script, "--pack", path, "--json")
    assert code == 2 and "modified after it was written" in r.output


def test_two_packs_applied_to_two_models_each_count_their_own_calls(tmp_path):
    x = torch.randn(4, 8)
    first = _write(tmp_path / "a.pack", [_op_entry(x, cid="a.card0:v1")])
    second = _write(tmp_path / "b.pack", [_op_entry(x, cid="b.card0:v1")])
    model_a, model_b = _Attn(), _Attn()
    applied_a = modulelens.apply_pack(model_a, first)
    applied_b = modulelens.apply_pack(model_b, second)
    try:
        model_a(x)
        model_b(x)
        model_b(x)
        applied_b.remove()
        model_a(x)
    finally:
        applied_a.remove()
        applied_b.remove()
    assert applied_a.report().hits == 2 and applied_b.report().hits == 2
    assert not torch._C._dispatch_has_kernel_for_dispatch_key("aten::_safe_softmax",
                                                               torch._C.DispatchKey.ADInplaceOrView)


# ---------------------------------------------------------------------------------------------
# Modes, phases, and a module entry with the operator entries inside it


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_inference_mode_calls_are_served_by_entries_validated_without_grad(tmp_path, mechanism):
    x = torch.randn(4, 8)
    path = _write(tmp_path / "p.pack", [_op_entry(x, grad=False)])
    with modulelens.use_pack(path, mechanism=mechanism) as pack:
        with torch.inference_mode():
            out = _softmax(x)
    with torch.inference_mode(), modulelens.use_pack(path, mechanism=mechanism) as late:  # entered the other way round
        _softmax(x)
        _softmax(torch.randn(4, 16))
    assert torch.allclose(out, _softmax(x))
    assert pack.report().hits == 1
    entry = late.report().entries[0]
    assert entry.hits == 1 and entry.fallbacks == 1 and "shape [4, 16]" in next(iter(entry.fallback_reasons))


BACKWARD_KERNEL = """
import torch
def forward(grad_output, output, dim, input_dtype):
    return torch.ops.aten._softmax_backward_data(grad_output, output, dim, input_dtype)
"""


def _backward_entry(x: torch.Tensor) -> PackEntry:
    y = torch.softmax(x, -1)
    return PackEntry(candidate_id="t.card9:v1", kind="op", target="t:v1/9", op="aten._softmax_backward_data.default",
                     pattern=describe_call([y, y, -1, torch.float32], {}, grad_enabled=False, training=True),
                     phase="backward", backend="triton", source=BACKWARD_KERNEL, source_sha256="test",
                     report=_report(), speedup_vs_eager=2.0)


def test_an_applied_model_serves_its_backward_and_counts_hits_per_phase(tmp_path):
    x = torch.randn(4, 8)
    path = _write(tmp_path / "p.pack", [_op_entry(x, cid="t.card0:v1"), _backward_entry(x)])
    model = _Attn().train()
    applied = modulelens.apply_pack(model, path)
    try:
        leaf = x.clone().requires_grad_()
        model(leaf).pow(2).sum().backward()
        model.eval()
        model(x.clone().requires_grad_()).sum().backward()  # eval: the op entries guard training
    finally:
        applied.remove()
    want = x.clone().requires_grad_()
    _softmax(want).pow(2).sum().backward()
    assert torch.allclose(leaf.grad, want.grad)
    forward, backward = applied.report().entries
    assert forward.hits_by_phase == {"forward": 2}  # its pattern records no training flag (an older pack's)
    assert backward.hits_by_phase == {"backward": 1} and backward.fallbacks == 1
    assert "training=False (validated: training=True)" in next(iter(backward.fallback_reasons))


OWN_BACKWARD = """
import torch
from torch import nn
class _Fn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = torch.ops.aten._safe_softmax(x, -1)
        ctx.save_for_backward(y)
        return y
    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return torch.ops.aten._softmax_backward_data(g, y, -1, torch.float32)
class ModelNew(nn.Module):
    def forward(self, x):
        return _Fn.apply(x)
"""


class _Holder(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = _Attn()

    def forward(self, x):
        return self.attn(x)


def test_a_module_entry_and_the_op_entries_inside_it_never_both_fire(tmp_path):
    x = torch.randn(4, 8)
    module = PackEntry(candidate_id="a.module:v1", kind="module", target="a:v1", class_path=class_path(_Attn),
                       module_path="attn", pattern=describe_call([x], {}, grad_enabled=True, training=True),
                       backend="module", entry="ModelNew", source=OWN_BACKWARD, source_sha256="test",
                       init=ModuleInit(args=[], kwargs={}), report=_report(), speedup_vs_eager=2.0)
    path = _write(tmp_path / "p.pack", [_op_entry(x, cid="t.card0:v1"), _backward_entry(x), module])
    model = _Holder().train()
    with modulelens.use_pack(path) as pack:
        leaf = x.clone().requires_grad_()
        model(leaf).pow(2).sum().backward()  # the module entry and its own backward
        other = torch.randn(4, 8, requires_grad=True)
        _softmax(other).pow(2).sum().backward()  # outside the module: the op entries
    by_id = {e.candidate_id: e for e in pack.report().entries}
    assert by_id["a.module:v1"].hits_by_phase == {"forward": 1, "backward": 1}
    assert by_id["t.card0:v1"].hits_by_phase == {"forward": 1}  # the call outside the module only
    assert by_id["t.card9:v1"].hits_by_phase == {"backward": 1}
    want = x.clone().requires_grad_()
    _softmax(want).pow(2).sum().backward()
    assert torch.allclose(leaf.grad, want.grad)


def test_a_run_with_no_hits_says_so_first_and_claims_no_speedup(cli, tmp_path):
    path = _write(tmp_path / "p.pack", [_op_entry(torch.randn(4, 8))])
    script = tmp_path / "s.py"
    script.write_text("import torch\nfor _ in range(3):\n    torch.softmax(torch.randn(4, 16), -1)\n")
    code, r, res = cli("run", script, "--pack", path, "--compare", "--repo", tmp_path, "--json")
    assert code == 0, res.output
    assert r["hits"] == 0 and r["summary"].startswith("0 hits") and r["step_ratio"] is None
    assert r["warnings"] and "(0 hits)" in r["warnings"][0]  # said first
    assert r["recorded"] is None  # the pack was never stored in this repository


def test_check_pack_says_which_capture_it_is_replaying(tmp_path):
    import anyio
    from mcp import Client

    from conftest import capture_tanh_scale
    from modulelens.mcp_server.server import build_server
    from modulelens.tools import all_tools

    capture_tanh_scale(tmp_path, "a")
    capture_tanh_scale(tmp_path, "b")
    path = _write(tmp_path / "p.pack", [_op_entry(torch.randn(4, 8))])
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    async def main():
        async with Client(build_server(all_tools(), repo_root=tmp_path)) as client:
            r = await client.call_tool("check_pack", {"pack": path, "captures": ["a", "b"], "min_run_time": 0.05},
                                       progress_callback=on_progress)
            assert not r.is_error, r.content

    anyio.run(main)
    said = [m for _, _, m in seen if m and m.startswith("replaying capture")]
    assert said[:1] == ["replaying capture 1/2, a: with the pack, then timed with and without it"], seen
    assert "replaying capture 2/2, b: with the pack, then timed with and without it" in said, seen
    assert any(total == 2 and done == 1 for done, total, _ in seen), seen  # a fraction, not only "working"


def test_pack_tables_at_80_columns_put_a_shape_rule_on_one_readable_line(app, tmp_path):
    """``show packs`` (and ``pack``'s own view) at 80 columns: a shape rule says where each
    variable size is (argument, dimension) and what is admitted, on its own line, not folded over
    many lines of a narrow column."""
    from click.testing import CliRunner
    from rich.console import Console

    from modulelens.cli.kernel_views import pack_view
    from modulelens.kernels.shape_rules import ShapeRule, VariableDim
    from modulelens.repo import Repository
    from modulelens.team.packs import store_pack
    from modulelens.tools.pack import PackResult

    rule = ShapeRule(dims=[VariableDim(at=[(0, 0)], captured=8, sizes=[1, 8, 17]),
                           VariableDim(at=[(0, 1), (1, 1)], captured=16, sizes=[16, 33])], checked=True)
    entries = [_op_entry(torch.randn(8, 16), cid=f"tinyformer_block.card{i}:v1").model_copy(update={"shape_rule": rule})
               for i in (3, 12)]
    path = _write(tmp_path / "model.pack", entries)
    store_pack(Repository(tmp_path), tmp_path / "model.pack")
    said = "argument 0, dim 0: captured 8, admits 1..17; argument 0, dim 1 = argument 1, dim 1: captured 16, admits 16..33"
    r = CliRunner().invoke(app, ["show", "packs", "model", "--repo", str(tmp_path)], env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    console = Console(width=80, record=True, file=open("/dev/null", "w"))  # pack's own view, as the CLI prints it
    console.print(pack_view(PackResult.model_validate(
        {"ref": "model:v1", "path": path, "sha256": "0" * 64, "environment": {},
         "entries": [{"candidate_id": e.candidate_id, "kind": "op", "target": "t:v1/0", "phase": "forward",
                      "backend": "triton", "verdict": "custom", "speedup_vs_eager": 2.0, "shape_rule": rule.summary(), "dispatched": True}
                     for e in entries]}), wide=False))
    for out in (r.stdout, console.export_text()):
        lines = out.splitlines()
        assert max(len(line) for line in lines) <= 80, out
        assert "tinyformer_block.card3:v1" in out and "tinyformer_block.card12:v1" in out, out
        flat = " ".join(line.strip() for line in lines)
        assert flat.count(said) == 2, out  # each entry's rule, whole, in words
        rule_lines = [i for i, line in enumerate(lines) if "argument" in line or "admits" in line]
        assert len(rule_lines) <= 2 * 2, out  # at most two lines per rule (80 columns), not five to nine


def test_run_progress_says_what_the_script_prints_in_each_run(tmp_path):
    import anyio
    from mcp import Client

    from modulelens.mcp_server.server import build_server
    from modulelens.tools import all_tools

    path = _write(tmp_path / "p.pack", [_op_entry(torch.randn(4, 8))])
    (tmp_path / "s.py").write_text("import time\nprint('step 0 done', flush=True)\ntime.sleep(0.6)\n"
                                   "print('step 1 done', flush=True)\n")
    seen: list[str | None] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append(message)

    async def main():
        async with Client(build_server(all_tools(), repo_root=tmp_path / ".modulelens")) as client:
            r = await client.call_tool("run", {"script": "s.py", "pack": path, "compare": True},
                                       progress_callback=on_progress)
            assert not r.is_error, r.content

    anyio.run(main)
    assert "running s.py with the pack: step 0 done" in seen and "running s.py without the pack: step 0 done" in seen, seen


def test_run_compare_prints_the_scripts_output_once_per_run_labelled(cli, tmp_path):
    path = _write(tmp_path / "p.pack", [_op_entry(torch.randn(4, 8))])
    script = tmp_path / "s.py"
    script.write_text("import torch\nfor i in range(2):\n    torch.softmax(torch.randn(4, 16), -1)\n"
                      "    print(f'step {i} done')\n")
    code, _, res = cli("run", script, "--pack", path, "--compare", "--repo", tmp_path)
    assert code == 0, res.output
    printed = [line for line in res.stderr.splitlines() if "done" in line and not line.startswith("run: ")]
    assert not any("step 0" in line for line in res.stderr.splitlines() if line.startswith("run: ")), res.stderr
    assert printed == ["[run 1/2: with the pack] step 0 done", "[run 1/2: with the pack] step 1 done",
                       "[run 2/2: without the pack] step 0 done", "[run 2/2: without the pack] step 1 done"], res.stderr
    code, _, res = cli("run", script, "--pack", path, "--repo", tmp_path)  # one run: printed as the script printed it
    assert [line for line in res.stderr.splitlines() if "done" in line and not line.startswith("run: ")] == [
        "step 0 done", "step 1 done"]


MUL_KERNEL = """
import torch
def forward(a, b):
    return torch.ops.aten.mul.Tensor(a, b)
"""


def test_a_non_default_overload_is_intercepted_and_a_python_number_goes_on_to_eager(tmp_path):
    x = torch.randn(4, 8)
    entry = PackEntry(candidate_id="t.card3:v1", kind="op", target="t:v1/3", op="aten.mul.Tensor",
                      pattern=describe_call([x, x], {}, grad_enabled=True), backend="triton", source=MUL_KERNEL,
                      source_sha256="test", report=_report(), speedup_vs_eager=2.0)
    path = _write(tmp_path / "p.pack", [entry])
    with modulelens.use_pack(path) as pack:
        out = x * x
        scaled = x * 0.25  # mul.Tensor with a wrapped number: a miss, on to eager
    assert torch.equal(out, x * x) and torch.equal(scaled, x * 0.25)
    assert (pack.report().hits, pack.report().fallbacks) == (1, 1)
