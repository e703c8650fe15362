"""The value-spec format (modulelens.capture.spec): every kind written and read back, the one
traversal, and the errors for specs that are not of this version's form."""

from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime
import enum
import pathlib
import http
import json
import math
import urllib.parse
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn as nn

from modulelens.capture import Resolver
from modulelens.capture.spec import (
    KIND,
    InvalidSpec,
    ModuleSpec,
    SpecVisitor,
    SpecWriter,
    TensorSpec,
    UnknownValueKind,
    UnsupportedValueKind,
    ValueKind,
    mapping_items,
    sequence_items,
)
from modulelens.capture.spec_walk import SpecWalker, referenced_modules, tensor_leaves
from modulelens.capture import Decoder, Encoder, TensorSink, TensorSource
from modulelens.errors import ModuleLensError, ReplayFailed

FIXTURES = Path(__file__).parent / "fixtures"


class Color(enum.Enum):
    RED = "r"


@dataclasses.dataclass
class Point:
    x: int
    y: float = 0.5


class Box:
    def __init__(self, content: Any):
        self.content = content


class Perm(enum.Flag):
    R = 1
    W = 2


class Mode(enum.StrEnum):
    FAST = "fast"


@dataclasses.dataclass(frozen=True)
class Span:
    start: int
    end: int


@dataclasses.dataclass
class Options:
    """A config-like dataclass holding every new container kind, nested."""

    keys: set = dataclasses.field(default_factory=set)
    spans: frozenset = frozenset()
    steps: range = range(0)
    window: Any = None
    mode: Mode = Mode.FAST
    perm: Perm = Perm.R
    where: pathlib.Path = pathlib.Path(".")
    when: datetime.datetime | None = None
    day: datetime.date | None = None
    at: datetime.time | None = None
    every: datetime.timedelta = datetime.timedelta(0)
    table: collections.OrderedDict = dataclasses.field(default_factory=collections.OrderedDict)
    groups: collections.defaultdict = dataclasses.field(default_factory=lambda: collections.defaultdict(list))
    point: Any = None


Pair = collections.namedtuple("Pair", "left right")


def _one_of_each() -> dict[ValueKind, Any]:
    """A value of every kind the encoder writes (module and unrecorded are tested apart)."""
    return {
        ValueKind.TENSOR: torch.arange(6.0).reshape(2, 3).t(),
        ValueKind.FLOAT: float("-inf"),
        ValueKind.DTYPE: torch.float16,
        ValueKind.DEVICE: torch.device("cpu"),
        ValueKind.TORCH: torch.channels_last,
        ValueKind.SIZE: torch.Size([4, 5]),
        ValueKind.ENUM: Color.RED,
        ValueKind.TYPE: nn.Linear,
        ValueKind.CALLABLE: torch.nn.functional.relu,
        ValueKind.COMPLEX: 2 - 1j,
        ValueKind.SLICE: slice(None, 5, 2),
        ValueKind.ELLIPSIS: Ellipsis,
        ValueKind.NUMBER: np.float64(1.5),  # decoded as the plain float
        ValueKind.LIST: [1, "a", None],
        ValueKind.TUPLE: (True, 2.5),
        ValueKind.DICT: collections.OrderedDict([("k", 1), ((1, 2), "tuple key")]),
        ValueKind.DEFAULTDICT: collections.defaultdict(list, {"a": [1]}),
        ValueKind.SET: frozenset({"b", "a", 3}),
        ValueKind.RANGE: range(2, 11, 3),
        ValueKind.PATH: pathlib.PurePosixPath("/data/shard-0"),
        ValueKind.DATETIME: datetime.datetime(2024, 5, 1, 12, 30, 5, 123, tzinfo=datetime.UTC),
        ValueKind.TIMEDELTA: datetime.timedelta(days=2, seconds=7, microseconds=9),
        ValueKind.NAMEDTUPLE: urllib.parse.SplitResult("http", "h", "/p", "", ""),
        ValueKind.DATACLASS: Point(3),
        ValueKind.OBJECT: Box([torch.float64]),
    }


def _resolver() -> Resolver:
    return Resolver()


@pytest.mark.parametrize("kind", [k for k in ValueKind if k not in (ValueKind.MODULE, ValueKind.UNRECORDED)])
def test_every_kind_round_trips_through_json(kind):
    value = _one_of_each()[kind]
    sink = TensorSink()
    spec = json.loads(json.dumps(Encoder(sink).encode(value, "v")))
    assert spec[KIND] == kind.value
    assert SpecWriter().visit(spec) == spec  # the writer and the reader agree on the fields
    out = Decoder(TensorSource(sink.tensors), _resolver()).decode(spec)
    if kind == ValueKind.TENSOR:
        assert torch.equal(out, value) and out.stride() == value.stride()
    elif kind == ValueKind.OBJECT:
        assert type(out) is Box and out.content == value.content
    elif kind in (ValueKind.FLOAT, ValueKind.NUMBER):
        assert out == value
    else:
        assert out == value and type(out) is type(value)


def _round_trip(value: Any) -> tuple[Any, dict[str, Any]]:
    sink = TensorSink()
    enc = Encoder(sink)
    spec = json.loads(json.dumps(enc.encode(value, "v")))
    assert not enc.unrecorded, enc.unrecorded
    assert SpecWriter().visit(spec) == spec
    return Decoder(TensorSource(sink.tensors), _resolver()).decode(spec), spec


def test_every_container_kind_round_trips_with_nested_dataclasses():
    opts = Options(
        keys={"rope_theta", "mrope_section"}, spans=frozenset({Span(0, 3), Span(4, 9)}), steps=range(0, 8, 2),
        window=slice(Span(1, 2), None, -1), mode=Mode.FAST, perm=Perm.R | Perm.W, where=pathlib.Path("/tmp/ckpt"),
        when=datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.timezone(datetime.timedelta(hours=2))),
        day=datetime.date(2024, 2, 29), at=datetime.time(23, 59, 1, 7), every=datetime.timedelta(minutes=90),
        table=collections.OrderedDict([("b", Span(1, 1)), ("a", [Span(2, 2)])]),
        groups=collections.defaultdict(list, {"x": [Pair(Span(0, 1), {Span(5, 6)})]}),
        point=Pair(left=Point(1, 2.0), right=frozenset({Pair(1, 2)})),
    )
    out, spec = _round_trip(opts)
    assert out == opts and type(out) is Options
    assert type(out.keys) is set and type(out.spans) is frozenset and type(out.mode) is Mode
    assert out.perm == Perm.R | Perm.W and type(out.where) is type(opts.where) and out.when.utcoffset().seconds == 7200
    assert type(out.table) is collections.OrderedDict and list(out.table) == ["b", "a"]
    assert type(out.groups) is collections.defaultdict and out.groups.default_factory is list
    assert out.groups["missing"] == [] and type(out.point) is Pair and type(out.point.left) is Point
    assert out.window.start == Span(1, 2) and out.steps == range(0, 8, 2)
    # a set's items are stored in one canonical order, whatever order the process iterates them in
    assert _round_trip({"mrope_section", "rope_theta"})[1] == _round_trip({"rope_theta", "mrope_section"})[1]
    assert _round_trip(Perm(0))[0] == Perm(0) and _round_trip(Mode.FAST)[1][KIND] == "enum"


def test_what_cannot_be_stored_keeps_its_repr_and_type_and_only_its_own_field():
    import threading

    lock = threading.Lock()
    enc = Encoder(TensorSink())
    spec = json.loads(json.dumps(enc.encode(Box({"lock": lock, "n": 1}), "init.cfg")))
    assert spec[KIND] == "object" and spec["state"]["content"]["items"][1][1] == 1  # the rest is kept
    bad = spec["state"]["content"]["items"][0][1]
    assert bad[KIND] == "unrecorded" and bad["at"] == "init.cfg.content.lock" and bad["type"] == "_thread:lock"
    assert bad["repr"].startswith("<unlocked _thread.lock object") and enc.found[0].attribute == "content"
    with pytest.raises(ReplayFailed, match=r"init\.cfg\.content\.lock \(a _thread:lock"):
        Decoder(TensorSource({}), _resolver()).decode(spec)
    held = Decoder(TensorSource({}), _resolver(), placeholders=True).decode(spec)
    assert held.content["n"] == 1 and "init.cfg.content.lock" in repr(held.content["lock"])
    with pytest.raises(ReplayFailed, match="the rebuilt module uses init.cfg.content.lock"):
        with held.content["lock"]:
            pass


def test_module_and_unrecorded_specs():
    inner = ModuleSpec(cls="torch.nn.modules.linear:Linear", args=[2, 3], kwargs={"bias": False})
    spec = json.loads(json.dumps(SpecWriter().module(inner)))
    assert spec == {KIND: "module", "cls": "torch.nn.modules.linear:Linear", "args": [2, 3], "kwargs": {"bias": False}}
    assert ModuleSpec.from_json(spec) == inner and SpecWriter().visit(spec) == spec
    built = Decoder(TensorSource({}), _resolver(), lambda m: _resolver()(m.cls)(*m.args, **m.kwargs)).decode(spec)
    assert isinstance(built, nn.Linear) and built.bias is None
    with pytest.raises(ReplayFailed, match="nested module cannot be rebuilt"):
        Decoder(TensorSource({}), _resolver()).decode(spec)

    enc = Encoder(TensorSink())
    lam = enc.encode(lambda x: x, "fn")
    assert lam[KIND] == "unrecorded" and enc.unrecorded == ["fn: a lambda or local function cannot be imported back"]
    assert SpecWriter().visit(lam) == lam
    with pytest.raises(ReplayFailed, match="was not recorded"):
        Decoder(TensorSource({}), _resolver()).decode(lam)


def test_tensor_spec_keeps_the_stored_form():
    sink = TensorSink("in.", max_bytes=8)
    small = sink.add("a", nn.Parameter(torch.ones(2)))
    big = sink.add("b", torch.zeros(3, 3))
    assert small == {KIND: "tensor", "key": "in.a", "shape": [2], "dtype": "float32", "device": "cpu", "stride": [1],
                     "contiguous": True, "requires_grad": True, "parameter": True, "stored": True}
    assert big["stored"] is False and big["stats"]["zero_fraction"] == 1.0 and "parameter" not in big
    assert sink.shape_only == ["in.b"] and set(sink.tensors) == {"in.a"}
    for spec in (small, big, {**small, "added_later": 1}):
        assert TensorSpec.from_json(spec).to_json() == spec  # unknown fields survive too
    synthesized = TensorSource({}).get(TensorSpec.from_json(big))
    assert synthesized.shape == (3, 3) and synthesized.abs().sum() == 0


def test_fixture_of_every_kind_written_by_the_previous_version_decodes():
    stored = json.loads((FIXTURES / "value_specs_all_kinds.json").read_text())
    spec = stored["value"]
    kinds_in_fixture = {node[KIND] for node in _nodes(spec) if isinstance(node, dict) and KIND in node}
    added_since = {"defaultdict", "set", "range", "path", "datetime", "timedelta"}
    assert kinds_in_fixture == {k.value for k in ValueKind} - {"module", "unrecorded"} - added_since
    assert SpecWriter().visit(spec) == spec
    source = TensorSource({})
    value = Decoder(source, _resolver()).decode(spec)
    assert source.synthesized == ["v.t", "v.tt", "v.p"]  # stored shape-only: made up from statistics
    assert value["tt"].shape == (3, 2) and value["tt"].stride() == (1, 3) and value["p"].requires_grad is True
    assert math.isinf(value["inf"]) and math.isnan(value["nan"]) and value["mf"] is torch.channels_last
    assert value["status"] is http.HTTPStatus.OK and value["cls"] is nn.ReLU and value["ell"] is Ellipsis
    assert value["nt"] == urllib.parse.SplitResult("http", "h", "/p", "", "") and value[(1, 2)] == "tuple key"
    assert value["dc"].file_name == "f.py" and isinstance(value["obj"], argparse.Namespace)
    assert value["obj"].b == [torch.float16] and type(value["od"]) is collections.OrderedDict
    assert SpecWriter().visit(stored["unrecorded"]) == stored["unrecorded"]


def _nodes(spec: Any) -> list[Any]:
    """Every JSON object and scalar inside a spec (a plain JSON walk, independent of the visitor)."""
    if isinstance(spec, dict):
        return [spec] + [n for v in spec.values() for n in _nodes(v)]
    if isinstance(spec, list):
        return [n for v in spec for n in _nodes(v)]
    return [spec]


def test_walker_visits_every_node_in_stored_order():
    enc = Encoder(TensorSink())
    spec = enc.encode({"a": [torch.ones(1), (torch.zeros(2),)], "b": Point(1), "c": slice(torch.ones(3), None, None)}, "v")
    assert [t.key for t in tensor_leaves(spec)] == ["v.a.0", "v.a.1.0", "v.c.start"]
    module = ModuleSpec(cls="pkg.mod:Net", args=[enc.encode(Color.RED, "x")], kwargs={"n": enc.encode(np.float64(1), "n")})
    assert referenced_modules(module.to_json()) == {"pkg.mod", __name__, "numpy"}
    assert referenced_modules(spec) == {__name__} and tensor_leaves(None) == []

    seen: list[str] = []

    class Recorder(SpecWalker):
        def class_ref(self, path: str) -> None:
            seen.append(path)

    Recorder().visit(module.to_json())
    assert seen == ["pkg.mod:Net", f"{__name__}:Color", "numpy:float64"]


def test_unknown_and_malformed_specs_are_clear_errors():
    walker = SpecWalker()
    with pytest.raises(UnknownValueKind, match="unknown value kind 'hologram'") as e:
        walker.visit({KIND: "hologram"})
    assert e.value.hint == "upgrade modulelens"
    for bad in ({KIND: "enum", "cls": "a:B"}, {KIND: "slice", "items": [1]}, {KIND: "dict", "items": [[1]]},
                {KIND: "tensor", "key": "k"}, {"items": []}, [1, 2], {KIND: "enum", "cls": 3, "name": "X"}):
        with pytest.raises(InvalidSpec, match="does not have the expected form"):
            walker.visit(bad)
    # the decoder keeps its own error for kinds from a newer version
    with pytest.raises(ReplayFailed, match="unknown value kind 'hologram' in the artifact"):
        Decoder(TensorSource({}), _resolver()).decode({KIND: "hologram"})


def test_a_visitor_handles_only_the_kinds_it_overrides():
    class Dtypes(SpecVisitor[str]):
        def dtype(self, name: str) -> str:
            return name

    assert Dtypes().visit({KIND: "dtype", "name": "bfloat16"}) == "bfloat16"
    with pytest.raises(UnsupportedValueKind, match="'device' are not supported"):
        Dtypes().visit({KIND: "device", "v": "cpu"})
    with pytest.raises(UnsupportedValueKind, match="plain values"):
        Dtypes().visit(3)
    assert issubclass(UnsupportedValueKind, ModuleLensError)


def test_items_of_a_stored_call():
    args = {KIND: "tuple", "items": [1, {KIND: "dtype", "name": "float16"}]}
    kwargs = {KIND: "dict", "items": [["dim", 1], ["keepdim", True]]}
    assert sequence_items(args) == [1, {KIND: "dtype", "name": "float16"}]
    assert mapping_items(kwargs) == [("dim", 1), ("keepdim", True)]
    assert sequence_items(None) == [] and mapping_items(None) == []
    with pytest.raises(UnsupportedValueKind, match="'dict' are not supported"):
        sequence_items(kwargs)
