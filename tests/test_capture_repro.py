"""The repro renderer (modulelens.capture.repro): value specs rendered as Python expressions that
evaluate, in the generated file's namespace, to what the decoder gives."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from modulelens.capture.repro import _HEADER, NotStandalone, ReproRenderer
from modulelens.capture import Resolver
from modulelens.capture.spec import KIND, ModuleSpec
from modulelens.capture import Decoder, TensorSource

FIXTURES = Path(__file__).parent / "fixtures"


def _evaluate(expr: str, imports: set[str], tmp_path: Path):
    """Evaluate a rendered expression after the generated file's header (its helpers and imports)."""
    namespace = {"__file__": str(tmp_path / "repro.py"), "__name__": "repro"}
    header = _HEADER.format(ref="x:v1", class_path="m:C", module_path="", data_name="data", needs="", future="",
                            imports="".join(f"import {m}\n" for m in sorted(imports)))
    exec(compile(header, "repro.py", "exec"), namespace)
    return eval(expr, namespace)


def test_every_kind_renders_to_what_the_decoder_gives(tmp_path):
    spec = json.loads((FIXTURES / "value_specs_all_kinds.json").read_text())["value"]
    renderer = ReproRenderer(set())
    rendered = _evaluate(renderer.visit(spec), renderer.imports, tmp_path)
    decoded = Decoder(TensorSource({}), Resolver()).decode(spec)
    assert rendered.keys() == decoded.keys()
    for key, want in decoded.items():
        got = rendered[key]
        if isinstance(want, torch.Tensor):  # stored shape-only: both make data up from the statistics
            assert (got.shape, got.dtype, got.requires_grad) == (want.shape, want.dtype, want.requires_grad), key
        elif isinstance(want, float) and math.isnan(want):
            assert math.isnan(got)
        elif key == "obj":
            assert type(got) is type(want) and vars(got) == vars(want)
        else:
            assert got == want and type(got) is type(want), key
    assert {"urllib.parse", "pstats", "argparse", "collections", "http"} <= renderer.imports


def test_container_kinds_added_later_render_to_what_the_decoder_gives(tmp_path):
    import collections
    import datetime
    import pathlib

    from modulelens.capture import Encoder, TensorSink

    value = {"set": {3, 1}, "frozen": frozenset({"a"}), "range": range(1, 9, 4), "path": pathlib.PurePosixPath("/x/y"),
             "when": datetime.datetime(2024, 3, 1, 8, 0, tzinfo=datetime.UTC), "day": datetime.date(2024, 3, 1),
             "every": datetime.timedelta(hours=3), "groups": collections.defaultdict(set, {"k": {1}})}
    spec = json.loads(json.dumps(Encoder(TensorSink()).encode(value, "v")))
    renderer = ReproRenderer(set())
    rendered = _evaluate(renderer.visit(spec), renderer.imports, tmp_path)
    decoded = Decoder(TensorSource({}), Resolver()).decode(spec)
    assert rendered == decoded == value
    assert all(type(rendered[k]) is type(value[k]) for k in value) and rendered["groups"].default_factory is set


def test_inlined_and_foreign_classes(tmp_path):
    module = ModuleSpec(cls="mymodel:Net", args=[{KIND: "dtype", "name": "float16"}], kwargs={"depth": 2})
    renderer = ReproRenderer({"mymodel"})
    assert renderer.module(module) == "Net(torch.float16, depth=2)" and renderer.imports == set()
    with pytest.raises(NotStandalone, match="needs mymodel.Net from outside torch"):
        ReproRenderer(set()).module(module)
    with pytest.raises(NotStandalone, match="builtins:function was not recorded"):
        ReproRenderer(set()).visit({KIND: "unrecorded", "type": "builtins:function", "repr": "<lambda>", "why": "lambda"})
    one = ReproRenderer(set()).visit({KIND: "tuple", "items": [1]})
    assert _evaluate(one, set(), tmp_path) == (1,)
