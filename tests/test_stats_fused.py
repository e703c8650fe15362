"""The C helper's paths of a sampled step (moments, input norms, parameter statistics, softmax and
attention rows) give what the PyTorch paths give, which run on GPUs and without a C compiler: on a
whole training run with the helper on and off, and function by function on the cases that break
one-pass code (masked and NaN rows, broadcast and strided attention inputs, sampled weights,
bfloat16, parameters replaced between the two halves of a step)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from modulelens.stats import StatsCollector, fused
from modulelens.stats import softmax as SM
from modulelens.stats import stats as S
from modulelens.stats.series import build_series
from modulelens.stats.updates import HostState, UpdateMeasurement, scalars_to_host


@pytest.fixture
def no_helper(monkeypatch):
    """Every statistic computed with PyTorch operators, as without a C compiler."""
    monkeypatch.setattr(fused, "_state", {"why": "turned off in a test"})


class Attention(nn.Module):
    """Causal self-attention through F.scaled_dot_product_attention, on strided q/k/v views."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in self.qkv(x).split(C, -1))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)


class Router(nn.Module):
    """A masked softmax over experts (entries of -inf) and a sparse ReLU mixture."""

    def __init__(self, dim: int, experts: int):
        super().__init__()
        self.gate = nn.Linear(dim, experts)
        self.experts = nn.Linear(dim, dim * experts)
        self.n = experts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.gate(x)
        logits = logits.masked_fill(logits < logits.median(-1, keepdim=True).values, -math.inf)
        weights = torch.softmax(logits, -1)
        out = torch.relu(self.experts(x)).view(*x.shape[:-1], self.n, -1)
        return (weights.unsqueeze(-1) * out).sum(-2)


class Net(nn.Module):
    def __init__(self, vocab: int = 50, dim: int = 16):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.attn = Attention(dim, 4)
        self.norm = nn.LayerNorm(dim)
        self.router = Router(dim, 4)
        self.act = nn.Tanh()
        self.head = nn.Linear(dim, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx)
        x = x + self.attn(self.norm(x))
        return self.head(self.act(x + self.router(x)))


def _run() -> dict:
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    stats = StatsCollector(model, every=2, fx=False, plots=False).start()
    for _ in range(5):
        idx = torch.randint(0, 50, (3, 12), generator=g)
        loss = F.cross_entropy(model(idx).reshape(-1, 50), idx.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return build_series(stats.finish()).model_dump()


def _close(a, b, path=""):
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            _close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-9), path
    else:
        assert a == b, path


def test_a_training_run_gives_the_same_series_with_and_without_the_helper(monkeypatch):
    with_helper = _run()
    assert fused.unavailable() is None
    monkeypatch.setattr(fused, "_state", {"why": "turned off in a test"})
    without = _run()
    assert without["modules"]["attn"]["softmax"]["entropy"][0] is not None  # the attention rows were seen
    assert without["modules"]["router"]["softmax"]["onehot_frac"][0] is not None
    assert all(v for v in without["params"]["head.weight"]["update_ratio"])
    assert without.pop("notes") == ["statistics of CPU tensors were computed with PyTorch operators, not in one pass: "
                                    "turned off in a test"] and with_helper.pop("notes") == []
    _close(with_helper, without)


def _rows_reference(logits: torch.Tensor) -> list[float]:
    valid = (logits != -math.inf).sum(-1, dtype=torch.float32)
    return SM.row_stats(torch.softmax(logits, -1), valid)


def test_softmax_rows_match_the_pytorch_path_on_masked_nan_and_peaked_rows():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(40, 300, generator=g) * 3  # rows longer than the C helper's chunk of 128
    logits[0, 1:] = -math.inf  # one unmasked entry: left out
    logits[1] = -math.inf  # all masked: left out
    logits[2, 7] = 80.0  # one-hot
    logits[3, ::2] = -math.inf
    logits[4, 5] = math.nan  # counted, with statistics 0
    logits[5, 3] = -200.0  # an exponential that underflows to 0
    got = fused.softmax_rows_cpu(logits, SM.ONEHOT_PROB)
    assert got is not None and got[0] == 38 and got[3] == 1
    assert [*got, 1.0] == pytest.approx(_rows_reference(logits), rel=1e-6, abs=1e-9)


@pytest.mark.parametrize("case", ["strided", "broadcast-k", "causal-more-keys", "float64", "over-budget"])
def test_attention_rows_read_in_place_match_the_pytorch_path(case, monkeypatch):
    g = torch.Generator().manual_seed(4)
    q = torch.randn(2, 3, 20, 8, generator=g)
    k = torch.randn(2, 3, 20, 8, generator=g)
    causal = True
    if case == "strided":
        q = torch.randn(2, 20, 3, 8, generator=g).transpose(1, 2)
        k = torch.randn(2, 20, 3, 8, generator=g).transpose(1, 2)
    elif case == "broadcast-k":
        k = torch.randn(1, 3, 20, 8, generator=g)
        causal = False
    elif case == "causal-more-keys":
        k = torch.randn(2, 3, 33, 8, generator=g)
    elif case == "float64":
        q, k = q.double(), k.double()
    elif case == "over-budget":  # more batch entries than SDPA_BUDGET logits: the first ones are kept
        q = torch.randn(80, 2, 20, 8, generator=g)
        k = torch.randn(80, 2, 600, 8, generator=g)
        causal = False
    host = SM.attention_weights(q, k, is_causal=causal, scale=0.3)
    monkeypatch.setattr(fused, "_state", {"why": "turned off in a test"})
    torch_path = SM.attention_weights(q, k, is_causal=causal, scale=0.3)
    assert host[0] == torch_path[0] > 0
    assert host == pytest.approx(torch_path, rel=1e-5)


def test_input_norms_are_exact_in_double():
    x = torch.full((1000,), 3e30)  # float32 squares overflow; in double they do not
    assert S.l2(x) == pytest.approx(x[0].item() * math.sqrt(1000), rel=1e-12)
    assert math.isnan(S.l2(torch.tensor([1.0, math.nan]))) and S.l2(torch.tensor([1.0, math.inf])) == math.inf


def _params():
    g = torch.Generator().manual_seed(5)
    shapes = {"big": (300, 400), "long_rows": (3, 300_000), "vector": (70_000,), "f64": (20, 30), "bf16": (64, 90),
              "table": (40, 8)}
    params = []
    for name, shape in shapes.items():
        dtype = torch.float64 if name == "f64" else torch.bfloat16 if name == "bf16" else torch.float32
        p = nn.Parameter(torch.randn(*shape, generator=g).to(dtype))
        p.grad = torch.randn(*shape, generator=g).to(dtype)
        if p.dim() == 2:
            p.grad[::3] = 0  # dead rows
        params.append((name, p))
    strided = nn.Parameter(torch.randn(30, 20, generator=g).t())  # not contiguous: the PyTorch path
    strided.grad = torch.randn(20, 30, generator=g)
    no_grad = nn.Parameter(torch.randn(10, 10, generator=g))
    return params + [("strided", strided), ("no_grad", no_grad)]


def _measure(params, steps: int, host: HostState | None) -> list[dict]:
    zero_rows: dict = {}
    out = []
    g = torch.Generator().manual_seed(6)
    for _step in range(steps):
        m = UpdateMeasurement()
        if host is None:
            m._before_step_torch(params, zero_rows, {"table"})
        else:
            m.before_step(params, zero_rows, {"table"}, host)
        with torch.no_grad():
            for _, p in params:
                p.add_(torch.randn(p.shape, generator=g).to(p.dtype) * 0.01)
        m.after_step([p for _, p in params])
        rec = {}
        for name, (numel, wn, gn, dead) in m.norms.items():
            dn, bn = scalars_to_host(list(m.updates[name]))
            rec[name] = (numel, *scalars_to_host([wn, gn if gn is not None else -1.0, dead if dead is not None else -1.0]),
                         dn / bn)
        out.append(rec)
        for _, p in params:
            if p.grad is not None:
                p.grad = torch.randn(p.grad.shape, generator=g).to(p.dtype)
                if p.dim() == 2:
                    p.grad[1::2] = 0  # rows 3, 9, 15... zero on both steps
    return out


def test_parameter_statistics_of_the_helper_match_the_pytorch_path():
    torch_path = _measure(_params(), 2, None)
    host = HostState()
    params = _params()
    helper = _measure(params, 2, host)
    assert {lay.ref() for lay in host.layouts.values()} == {p for n, p in params if n != "strided"}
    for a, b in zip(torch_path, helper):
        assert a.keys() == b.keys()
        for name in a:
            rel = 1e-2 if name == "bf16" else 1e-5  # PyTorch's bfloat16 norms round to bfloat16
            assert b[name] == pytest.approx(a[name], rel=rel), name
    assert helper[0]["big"][3] == pytest.approx(1 / 3, abs=0.01)  # every third row zero
    assert helper[1]["big"][3] == pytest.approx(1 / 6, abs=0.01)  # zero on both steps: every sixth
    assert helper[0]["table"][3] == -1.0 and helper[0]["no_grad"][2] == -1.0


def test_bfloat16_parameter_norms_are_exact_in_double():
    p = nn.Parameter(torch.randn(64, 90).bfloat16())
    p.grad = torch.randn(64, 90).bfloat16()
    m = UpdateMeasurement()
    m.before_step([("w", p)], {}, set(), HostState())
    assert m.norms["w"][1] == pytest.approx(p.detach().double().norm().item(), rel=1e-12)
    assert m.norms["w"][2] == pytest.approx(p.grad.double().norm().item(), rel=1e-12)


def test_a_parameter_replaced_during_the_step_gets_no_update_ratio():
    p = nn.Parameter(torch.randn(50, 20))
    p.grad = torch.randn(50, 20)
    m = UpdateMeasurement()
    m.before_step([("w", p)], {}, set(), HostState())
    p.data = torch.randn(10, 5)  # smaller: the copy no longer fits what the C helper would read
    m.after_step([p])
    assert "w" in m.norms and "w" not in m.updates


def test_a_leaf_module_output_gets_its_gradient_statistics():
    """nn.Identity on a leaf that requires grad returns the leaf: its gradient comes from a tensor hook."""
    model = nn.Sequential(nn.Identity(), nn.Linear(4, 2))
    x = torch.randn(5, 4, requires_grad=True)
    collector = StatsCollector(model, every=1, fx=False).start()
    model(x).pow(2).sum().backward()
    run = collector.finish()
    grad = run.records[0].modules["0"].grad
    assert grad is not None and grad[S._I["m2"]] == pytest.approx(((x.grad - x.grad.mean()) ** 2).sum().item(), rel=1e-6)
