"""Pure logic of modulelens.stats.order: merging observed orders, combining them with fx."""

from __future__ import annotations

import torch
import torch.nn as nn

from modulelens.stats.order import combine_order, execution_order, fx_leaf_order, merge_observed


def test_merge_observed_inserts_new_modules_after_their_predecessor():
    order: list[str] = []
    merge_observed(order, ["", "stem", "head"])
    merge_observed(order, ["", "stem", "branch", "head"])  # a branch taken only on this step
    merge_observed(order, ["", "stem", "head"])
    assert order == ["", "stem", "branch", "head"]


def test_combine_order_puts_containers_first_and_unseen_modules_in_place():
    observed = ["", "x", "enc", "enc.1", "enc.0", "extra", "head"]
    assert combine_order(observed, ["x", "enc.1", "enc.0", "head"]) == ["", "x", "enc", "enc.1", "enc.0", "extra", "head"]
    assert combine_order(["", "b", "a"], ["a", "b"]) == ["", "a", "b"]


class _Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(2, 2), nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x) if x.sum() > 0 else self.b(x)  # data-dependent: fx cannot trace it


def test_execution_order_uses_fx_when_it_traces_and_says_why_not():
    seq = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    assert fx_leaf_order(seq) == (["0", "1"], None)
    assert execution_order(["", "1", "0"], seq, use_fx=True) == (["", "0", "1"], "fx", None)
    assert execution_order(["", "1", "0"], seq, use_fx=False) == (["", "1", "0"], "observed", None)
    order, source, note = execution_order(["", "b"], _Branchy(), use_fx=True)
    assert (order, source) == (["", "b"], "observed") and note and "torch.fx could not trace" in note


def test_execution_order_looks_through_wrappers():
    model = nn.Sequential(nn.Linear(2, 2), nn.Tanh())
    compiled = torch.compile(model)
    assert execution_order(["", "1", "0"], compiled, use_fx=True)[:2] == (["", "0", "1"], "fx")
