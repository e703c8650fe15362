"""Softmax statistics: every spelling of softmax inside a module is seen on sampled steps and given to
that module; the attention weights inside F.scaled_dot_product_attention are recomputed from q and
k exactly as the math path computes them; masked entries are left out; nothing is left on the
torch-function mode stack."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from modulelens.stats import softmax as SM
from modulelens.stats.collector import StatsCollector
from modulelens.stats.series import build_series


def _expected(p: torch.Tensor, valid: torch.Tensor) -> list[float]:
    """The softmax vector written out: rows with >= 2 unmasked entries, entropy / log(count)."""
    count = valid.sum(-1).double()
    keep = count >= 2
    entropy = -(torch.special.xlogy(p.double(), p.double())).sum(-1) / torch.log(count.clamp(min=2))
    top = p.double().amax(-1)
    return [keep.sum().item(), entropy[keep].sum().item(), top[keep].sum().item(), (top[keep] >= 0.99).sum().item(), 1.0]


@pytest.mark.parametrize("case", ["causal", "bool-mask", "float-mask", "gqa", "scaled"])
def test_attention_weights_are_recomputed_as_the_math_path_computes_them(case):
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 4, 9, 8, generator=g), torch.randn(2, 4, 11, 8, generator=g)
    kwargs: dict = {}
    valid = torch.ones(9, 11, dtype=torch.bool)
    logits = q @ k.transpose(-2, -1) / math.sqrt(8)
    if case == "causal":
        kwargs["is_causal"] = True
        valid = torch.ones(9, 11).tril().bool()
    elif case == "bool-mask":
        valid = torch.rand(9, 11, generator=g) > 0.3
        kwargs["attn_mask"] = valid
    elif case == "float-mask":
        mask = torch.where(torch.rand(9, 11, generator=g) > 0.3, 0.0, -math.inf) + 0.5
        kwargs["attn_mask"] = mask
        valid = mask != -math.inf
        logits = logits + mask
    elif case == "gqa":
        k = k[:, :2]
        kwargs["enable_gqa"] = True
        logits = q @ k.repeat_interleave(2, dim=1).transpose(-2, -1) / math.sqrt(8)
    else:
        kwargs["scale"] = 3.0
        logits = logits * math.sqrt(8) * 3.0
    p = torch.softmax(logits.masked_fill(~valid, -math.inf), -1).nan_to_num()
    got = SM.attention_weights(q, k, **kwargs)
    assert got == pytest.approx(_expected(p, valid.expand(p.shape)), rel=1e-5, abs=1e-6)


class Heads(nn.Module):
    """Softmax in every spelling: F.softmax, a method, nn.Softmax, log_softmax, a masked one."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.sm = nn.Softmax(dim=-1)
        self.out = nn.Linear(6, 1)

    def forward(self, x):
        h = self.lin(x)
        a = F.softmax(h, dim=-1) + h.softmax(-1) + self.sm(h)
        masked = h.masked_fill(torch.arange(6) >= 3, -math.inf)
        b = torch.log_softmax(masked, -1).exp()
        return self.out(a + b)


def test_every_softmax_spelling_is_given_to_the_module_that_computed_it():
    torch.manual_seed(0)
    model = nn.Sequential(Heads(), nn.ReLU())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    collector = StatsCollector(model, every=1, fx=False).start()
    x = torch.randn(5, 6)
    h = model[0].lin(x).detach()
    for _ in range(2):
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
    assert torch._C._len_torch_function_stack() == 0  # the observer is gone after the forward pass
    series = build_series(collector.finish())
    own, module = series.modules["0"], series.modules["0.sm"]
    assert own.softmax["calls"][0] == 3 and own.softmax_source == ["softmax", "log_softmax"]  # F., method, log
    assert module.softmax["calls"][0] == 1 and module.softmax["rows"][0] == 5  # nn.Softmax: its own module
    full = _expected(torch.softmax(h, -1), torch.ones(5, 6, dtype=torch.bool))
    assert module.softmax["entropy"][0] == pytest.approx(full[1] / full[0], rel=1e-5)
    assert module.softmax["max_prob"][0] == pytest.approx(full[2] / full[0], rel=1e-5)
    masked = _expected(torch.softmax(h[:, :3], -1), torch.ones(5, 3, dtype=torch.bool))  # -inf entries left out
    assert own.softmax["entropy"][0] == pytest.approx((2 * full[1] + masked[1]) / 15, rel=1e-5)
    assert series.modules["1"].softmax == {} and series.modules["0.lin"].softmax == {}


@pytest.mark.parametrize("padding", [False, True])
def test_multihead_attention_is_observed_through_its_fused_kernel(padding):
    torch.manual_seed(0)

    class Wrap(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp, self.mha = nn.Linear(16, 16), nn.MultiheadAttention(16, 4, batch_first=True)

        def forward(self, x, pad=None):
            h = self.inp(x)
            return self.mha(h, h, h, key_padding_mask=pad, need_weights=False)[0]

    wrap = Wrap()
    x = torch.randn(2, 7, 16)
    pad = torch.zeros(2, 7, dtype=torch.bool)
    pad[1, 5:] = True
    pad = pad if padding else None
    collector = StatsCollector(wrap, every=1, fx=False).start()
    wrap(x, pad).sum().backward()
    series = build_series(collector.finish())
    m = series.modules["mha"]
    assert m.softmax_source == ["scaled_dot_product_attention"] and m.softmax["rows"][0] == 2 * 4 * 7
    with torch.no_grad():  # the module's own weights, per head
        h = wrap.inp(x)
        w = wrap.mha(h, h, h, key_padding_mask=pad, need_weights=True, average_attn_weights=False)[1]
    valid = torch.ones_like(w, dtype=torch.bool) if pad is None else ~pad[:, None, None, :].expand(w.shape)
    rows, entropy, top, _, _ = _expected(w, valid)
    assert m.softmax["entropy"][0] == pytest.approx(entropy / rows, rel=1e-4)
    assert m.softmax["max_prob"][0] == pytest.approx(top / rows, rel=1e-4)


def test_the_hooks_own_torch_calls_do_not_pass_through_the_observer(monkeypatch):
    seen: list = []
    original = SM.SoftmaxObserver.__torch_function__

    def counting(self, func, types, args=(), kwargs=None):
        seen.append(getattr(func, "__name__", str(func)))
        return original(self, func, types, args, kwargs)

    monkeypatch.setattr(SM.SoftmaxObserver, "__torch_function__", counting)
    model = nn.Sequential(nn.Linear(4, 4), Gate(4), nn.ReLU(), nn.Linear(4, 1))
    collector = StatsCollector(model, every=1, fx=False).start()
    model(torch.randn(3, 4)).sum().backward()
    run = collector.finish()
    # The model's own calls only, not the statistics': those of Gate's forward (a module of ours,
    # which could call a softmax); Linear and ReLU call none, and the observer stays off while they run.
    assert set(seen) == {"softmax", "mul"}
    assert run.records[0].modules["1"].softmax is not None


class Gate(nn.Module):
    """x * softmax(W x): a softmax between two quiet torch.nn calls."""

    def __init__(self, dim: int):
        super().__init__()
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.softmax(self.proj(x), -1)


def test_a_softmax_inside_a_replaced_forward_of_a_quiet_class_is_seen():
    """Linear, ReLU and the like call no softmax; one whose forward was replaced on the instance may."""
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    relu = model[1]
    relu.forward = lambda x: torch.softmax(x, -1)
    collector = StatsCollector(model, every=1, fx=False).start()
    model(torch.randn(3, 4)).sum().backward()
    run = collector.finish()
    assert run.records[0].modules["1"].softmax is not None and run.records[0].modules["0"].softmax is None
