"""The templates' view of a card (modulelens.kernels.templates.call, .loops, .cpp, .triton): value
specs decoded, entry-point names made safe, loop nests merged, source headers and checks."""

from __future__ import annotations

import math

import pytest
import torch

from modulelens.kernels.templates import synthetic_card
from modulelens.kernels.templates.call import (
    Const,
    NoMatch,
    TArg,
    call_from_card,
    contiguous_strides,
    decode,
    jsonable,
)
from modulelens.kernels.templates.cpp import cpp_checks, cpp_header, cpp_literal, cpp_type
from modulelens.kernels.templates.loops import broadcast_strides, loop_nest, next_pow2, offset_terms
from modulelens.kernels.templates.triton import py_checks, py_header, py_literal
from modulelens.ops import as_card


def _tensor_spec(shape, stride=None, **extra):
    return {"$": "tensor", "key": "t", "shape": shape, "dtype": "float32", "stride": stride, "contiguous": stride is None,
            "device": "cpu", **extra}


def test_decode_value_specs():
    assert decode(None) is None and decode(3) == 3 and decode("tanh") == "tanh"
    t = decode(_tensor_spec([2, 3]))
    assert t == TArg((2, 3), "float32", (3, 1), True, "cpu") and t.numel == 6 and t.ndim == 2
    assert decode(_tensor_spec([2, 3], [1, 2])).stride == (1, 2)
    assert decode({"$": "list", "items": [1, {"$": "tuple", "items": [2]}]}) == [1, [2]]
    assert decode({"$": "float", "v": "-inf"}) == -math.inf
    assert decode({"$": "dtype", "name": "float16"}) == Const("dtype", "float16")
    assert decode({"$": "torch", "name": "channels_last"}) == Const("torch", "channels_last")
    assert decode({"$": "device", "v": "cpu"}) == Const("device", "cpu")
    with pytest.raises(NoMatch, match="layout"):
        decode(_tensor_spec([2], layout="sparse_coo"))
    with pytest.raises(NoMatch, match="kind 'module'"):
        decode({"$": "module", "cls": "x"})


def test_call_from_a_card_and_from_its_stored_form_agree():
    x = torch.randn(4, 8)
    stored = synthetic_card("aten.sum.dim_IntList", [x, [1], True], {"dtype": torch.float32})
    call = call_from_card(stored)
    assert call == call_from_card(as_card(stored))
    assert call.op == "aten.sum.dim_IntList" and call.base == "sum"
    assert call.names == ["self", "dim", "keepdim", "dtype"] and call.kwargs == {"dtype": Const("dtype", "float32")}
    assert call.arg("dim") == [1] and call.arg("missing", 7) == 7 and call.param("keepdim") == "keepdim"
    assert [o.shape for o in call.outputs] == [(4, 1)] and len(call.tensors) == 1
    with pytest.raises(NoMatch, match="no stored sample"):
        call_from_card({"op": "aten.relu.default"})


def test_entry_point_names_are_safe_for_cpp_and_python():
    # aten.random_.from takes an argument called `from` (a Python keyword).
    call = call_from_card(synthetic_card("aten.random_.from", [torch.zeros(3), 0, 5]))
    assert call.schema_names == ["self", "from", "to"] and call.names == ["self", "from_", "to"]


def test_loops_broadcast_and_merge():
    out = TArg((8, 4, 32, 32), "float32", contiguous_strides((8, 4, 32, 32)), True, "cpu")
    bias = TArg((32, 32), "float32", (32, 1), True, "cpu")
    strides = broadcast_strides(bias, out.shape)
    assert strides == [0, 0, 32, 1]
    loops = loop_nest(out, [strides])
    assert loops == [(32, [1024, 0]), (1024, [1, 1])]  # [8, 4] merged; [32, 32] merged
    assert offset_terms(loops, 1, "i", outer_only=False) == ["(i % 1024)"]
    with pytest.raises(NoMatch, match="does not broadcast"):
        broadcast_strides(TArg((3,), "float32", (1,), True, "cpu"), (4, 5))
    assert [next_pow2(n) for n in (1, 2, 3, 1000)] == [1, 2, 4, 1024]


def test_source_pieces():
    card = synthetic_card("aten.gelu.default", [torch.randn(4, 8)])
    call = call_from_card(card)
    assert cpp_header(call, "elementwise", 1, {"grain": 2}).startswith("// modulelens template: family elementwise, variant 1")
    assert py_header(call, "elementwise", 1, {"grain": 2}).startswith("# modulelens template: family elementwise, variant 1")
    assert cpp_header(call, "f", 0, {}).splitlines()[1] == "// aten.gelu.default [4, 8] float32"
    assert cpp_checks(call) == '  ml_check(self, "self", {4, 8}, {8, 1}, at::kFloat);'
    assert py_checks(call) == '    _check(self, "self", [4, 8], [8, 1], torch.float32)'
    assert cpp_literal(-math.inf, "float") == "static_cast<float>(-INFINITY)" and py_literal(math.nan) == 'float("nan")'
    assert cpp_type([1, 2]) == "std::vector<int64_t>" and cpp_type(Const("dtype", "float32")) == "at::ScalarType"
    with pytest.raises(NoMatch):
        cpp_type(Const("device", "cpu"), cuda=True)
    assert jsonable({"a": (1, 2), "b": [(3, 4)], "c": 5}) == {"a": [1, 2], "b": [[3, 4]], "c": 5}
