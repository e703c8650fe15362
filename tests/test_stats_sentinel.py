"""The NaN/Inf check of every step (the rerun's sentinel) names where NaN/Inf is born: the module,
the step, the phase (forward, backward, optimizer) and what held it first (input, output, weight,
gradient). In-process, on small models with one planted fault each."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from modulelens.stats.collector import StopRun
from modulelens.stats.schema import NanOrigin
from modulelens.stats.sentinel import NonfiniteSentinel


class Flaky(nn.Module):
    """Identity, except that its call number ``at`` divides by zero."""

    def __init__(self, at: int):
        super().__init__()
        self.at, self.calls = at, 0

    def forward(self, x):
        y = x * 1.0
        if self.calls == self.at:
            y = y / (x - x)
        self.calls += 1
        return y


class NanBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g * float("nan")


class BadBackward(nn.Module):
    """Forward is the identity; on call ``at`` its backward turns the gradient into NaN."""

    def __init__(self, at: int):
        super().__init__()
        self.at, self.calls = at, 0

    def forward(self, x):
        self.calls += 1
        return NanBackward.apply(x) if self.calls - 1 == self.at else x * 1.0


class LogInside(nn.Module):
    """Its own code (between its two children) takes a log that is NaN from call ``at`` on."""

    def __init__(self, at: int):
        super().__init__()
        self.a, self.b, self.at, self.calls = nn.Linear(4, 4), nn.Linear(4, 4), at, 0

    def forward(self, x):
        h = self.a(x)
        if self.calls == self.at:
            h = torch.log(h - 100.0)
        self.calls += 1
        return self.b(h)


def _run(model: nn.Module, steps: int = 8, stop_step: int = 6, lr=0.01, hook=None) -> NanOrigin:
    torch.manual_seed(0)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    sentinel = NonfiniteSentinel(stop_step).start()
    try:
        for step in range(steps):
            x = torch.randn(5, 4)
            if hook is not None:
                x = hook(step, model, opt, x)
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    except StopRun:
        pass
    finally:
        sentinel.stop()
    return sentinel.result()


def _where(o: NanOrigin) -> tuple:
    return (o.found, o.module, o.step, o.phase, o.tensor)


def test_a_module_whose_output_turns_nan_between_sampled_steps():
    o = _run(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), Flaky(at=3), nn.Linear(4, 2)))
    assert _where(o) == (True, "2", 3, "forward", "output")
    assert o.seen_in == "output of 2" and o.steps_checked == 4


def test_a_backward_that_makes_nan_gradients():
    o = _run(nn.Sequential(nn.Linear(4, 4), BadBackward(at=2), nn.Tanh(), nn.Linear(4, 2)))
    assert _where(o) == (True, "1", 2, "backward", "gradient")
    assert o.seen_in == "gradient w.r.t. the input of 1"


def test_an_optimizer_step_that_writes_nan_weights():
    def spike(step, model, opt, x):
        for g in opt.param_groups:
            g["lr"] = float("inf") if step == 4 else 0.01
        return x

    o = _run(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)), hook=spike)
    assert _where(o) == (True, "0", 4, "optimizer", "weight") and o.parameter == "0.weight"


def test_weights_written_outside_the_optimizer_and_nan_data():
    def write(step, model, opt, x):
        if step == 2:
            with torch.no_grad():
                model[2].weight[0, 0] = float("nan")
        return x

    o = _run(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)), hook=write)
    assert _where(o) == (True, "2", 2, "forward", "weight")
    assert "outside the optimizer" in o.detail

    def bad_batch(step, model, opt, x):
        return x.masked_fill(torch.zeros_like(x, dtype=torch.bool).index_fill_(0, torch.tensor([1]), step == 3), float("nan"))

    o = _run(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)), hook=bad_batch)
    assert _where(o) == (True, "", 3, "forward", "input")


def test_nan_made_by_a_modules_own_code_between_its_children():
    o = _run(nn.Sequential(nn.Linear(4, 4), LogInside(at=2), nn.Linear(4, 2)))
    assert _where(o) == (True, "1", 2, "forward", "output") and o.seen_in == "input of 1.b"


def test_a_run_without_nan_up_to_the_step_says_it_was_not_reproduced():
    o = _run(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)), stop_step=3)
    assert not o.found and o.steps_checked == 3 and "does not repeat itself" in o.detail


def test_the_sentinel_leaves_no_hook_behind():
    from torch.nn.modules import module as nn_module

    _run(nn.Sequential(nn.Linear(4, 4), Flaky(at=1), nn.Linear(4, 2)))
    assert not nn_module._global_forward_hooks and not nn_module._global_forward_pre_hooks


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_large_finite_values_are_not_mistaken_for_overflow(dtype):
    from modulelens.stats.sentinel import finite_check

    big = torch.full((1000,), 3e38 if dtype == torch.float32 else 3e38, dtype=dtype)
    assert torch.isfinite(finite_check(big)) and not torch.isfinite(finite_check(torch.tensor([1.0, float("inf")])))


def test_forward_steps_without_an_optimizer():
    model = nn.Sequential(nn.Linear(4, 4), Flaky(at=2), nn.Linear(4, 2))
    sentinel = NonfiniteSentinel(5, step_on="forward").start()
    try:
        for _ in range(8):
            model(torch.randn(3, 4))
    except StopRun:
        pass
    finally:
        sentinel.stop()
    assert _where(sentinel.result()) == (True, "1", 2, "forward", "output")
