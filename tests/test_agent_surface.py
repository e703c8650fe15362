"""What an agent sees, in-process: tools declared once (the decorator and the registry), strict
arguments (unknown names, types and values refused one line per field), hints and warnings phrased
per front end (tool arguments over MCP, flags in the CLI), next calls as tool calls over MCP and
command lines in the CLI, a ``tools/list`` within budget (at most 24 tools, 15,000 characters),
replies whose text is their structured content as compact JSON, capped ``top``/``limit``, and long
lists cut with a pointer to the full data. The stdio run of the whole loop is
tests/test_mcp_agent_e2e.py."""

from __future__ import annotations

import json
from typing import Any, Literal

import anyio
import pytest
from mcp import Client
from pydantic import BaseModel, Field, ValidationError, model_validator
from click.testing import CliRunner

from modulelens.arguments import argument_errors, did_you_mean, unknown_names
from modulelens.cli.app import build_app
from modulelens.errors import ModuleLensError, arg, render, tool_call
from modulelens.listing import LeftOut, everything, keep_first
from modulelens.mcp_server.schema import compact_schema
from modulelens.mcp_server.server import build_server
from modulelens.registry import Tool, ToolContext, ToolRegistry, tool
from modulelens.replies import ToolReply, call
from modulelens.stats.runs import ModuleSeries, StatsRunEntry, StatsRunView, thin_steps

# --------------------------------------------------------------------------------------------
# A fake tool with the kinds of arguments that go wrong
# --------------------------------------------------------------------------------------------


class BuildRequest(BaseModel):
    card: str | None = Field(None, description="Card id.")
    source: str | None = Field(None, description="Kernel source file.")
    target: str | None = Field(None, description="With a source: its card id.")
    backend: Literal["cpp", "cuda", "triton"] | None = None
    seeds: int = Field(2, ge=1, le=10)
    top: int = Field(3, ge=1, le=100, description="Items listed.")

    @model_validator(mode="after")
    def _one_input(self) -> BuildRequest:
        if self.card and self.source:
            raise ValueError(f"give {arg('card')} or {arg('source', 'FILE')}, not both")
        return self


class BuildResult(ToolReply):
    card: str
    seeds: int
    items: list[int]
    left_out: list[LeftOut] = Field(default_factory=list)


def _build(req: BuildRequest, ctx: ToolContext) -> BuildResult:
    if req.source and not (req.target and req.backend):
        raise ModuleLensError("[--source] needs [--target CARD] and [--backend]",
                              "e.g. [--source k.cpp] [--target blk/6] [--backend cpp]")
    result = BuildResult(card=req.card or "blk/0", seeds=req.seeds, items=list(range(12)))
    result.warnings = [f"timing undetermined: pass {arg('seeds', 'N')} above {req.seeds}"]
    result.next = [call("build", card="blk/3", top=5, backend="cpp")]
    return keep_first(result, "items", req.top, "modulelens://items")


BUILD = Tool("build", BuildRequest, BuildResult, _build, "Build a kernel for a card.")
MAX_TOOLS = 24
MAX_TOOLS_LIST_CHARS = 15_000  # tools/list as the client receives it (compact JSON)


def _mcp(tools: list[Tool], body) -> Any:
    async def main():
        async with Client(build_server(tools)) as client:
            return await body(client)

    return anyio.run(main)


def _call(arguments: dict) -> Any:
    async def body(c):
        return await c.call_tool("build", arguments)

    return _mcp([BUILD], body)


@pytest.fixture
def cli():
    app = build_app([BUILD], rich_help=False)
    runner = CliRunner()
    return lambda *args: runner.invoke(app, list(args))


# --------------------------------------------------------------------------------------------
# Argument markers
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("marker,cli_text,args_text", [
    (arg("target"), "--target", "target"),
    (arg("target", "CARD"), "--target CARD", "target"),
    (arg("strategy", "export"), "--strategy export", "strategy=export"),
    (arg("eager", False), "--no-eager", "eager=false"),
    (arg("trust_pickle", True), "--trust-pickle", "trust_pickle"),
    (arg("script_args", "ARGS..."), "--script-args ARGS...", "script_args"),
])
def test_markers_render_per_front_end(marker, cli_text, args_text):
    assert render(f"use {marker} here", "cli") == f"use {cli_text} here"
    assert render(f"use {marker} here", "args") == f"use {args_text} here"


def test_text_without_markers_is_unchanged():
    text = "pip install 'modulelens[wandb]' -- see [notes] and `modulelens list-captures`"
    assert render(text, "cli") == render(text, "args") == text


def test_error_keeps_markers_and_renders_them_on_demand():
    e = ModuleLensError("[--source] needs [--target CARD]", "pass [--device cpu]")
    assert e.message == "[--source] needs [--target CARD]"  # raw: crosses process boundaries as is
    assert e.rendered("cli") == ("--source needs --target CARD", "pass --device cpu")
    assert e.rendered("args") == ("source needs target", "pass device=cpu")
    assert str(e) == "source needs target (pass device=cpu)"


# --------------------------------------------------------------------------------------------
# Strict arguments, unit level
# --------------------------------------------------------------------------------------------


def test_unknown_names_list_the_valid_ones_with_a_did_you_mean():
    line = unknown_names(BuildRequest, ["card", "sedes"])
    assert line == ("unknown argument 'sedes' (did you mean seeds?); valid: card, source, target, backend, seeds, "
                    "top")
    assert unknown_names(BuildRequest, ["card", "seeds"]) is None
    assert "--seeds" in unknown_names(BuildRequest, ["sedes"], label=lambda n: "--" + n)
    assert did_you_mean("zzz", ["card", "seeds"]) is None


def _errors(data: dict, **kwargs) -> list[str]:
    with pytest.raises(ValidationError) as e:
        BuildRequest.model_validate(data)
    return argument_errors(e.value, **kwargs)


def test_type_enum_and_range_errors_are_one_line_per_field():
    lines = _errors({"seeds": "ten", "backend": "cpu", "top": 0})
    assert len(lines) == 3
    by_field = {line.split(":")[0]: line for line in lines}
    assert by_field["seeds"] == "seeds: got 'ten', expected a valid integer, unable to parse string as an integer"
    assert by_field["backend"].startswith("backend: got 'cpu', expected one of 'cpp', 'cuda' or 'triton'")
    assert by_field["backend"].endswith("(did you mean 'cpp'?)")
    assert by_field["top"] == "top: got 0, expected greater than or equal to 1"
    assert not any("pydantic" in line or "http" in line for line in lines)


def test_checks_across_fields_render_their_markers():
    assert _errors({"card": "blk/0", "source": "k.cpp"}) == ["give card or source, not both"]
    assert _errors({"card": "blk/0", "source": "k.cpp"}, front="cli") == ["give --card or --source FILE, not both"]


def test_missing_fields_say_required():
    class Needs(BaseModel):
        ref: str

    with pytest.raises(ValidationError) as e:
        Needs.model_validate({})
    assert argument_errors(e.value) == ["ref: required"]


# --------------------------------------------------------------------------------------------
# Strict arguments and hints over MCP
# --------------------------------------------------------------------------------------------


def test_mcp_refuses_a_misspelt_argument():
    r = _call({"card": "blk/0", "sedes": 3})
    assert r.is_error
    text = r.content[0].text
    assert "'sedes'" in text and "did you mean seeds?" in text and "valid: card, source, target" in text
    assert "\n" not in text


def test_mcp_type_and_enum_errors_name_the_field():
    r = _call({"seeds": "ten", "backend": "cpu"})
    assert r.is_error
    lines = r.content[0].text.splitlines()
    assert lines[0] == "invalid arguments:" and len(lines) == 3
    assert any(line.startswith("seeds: got 'ten'") for line in lines)
    assert any(line.startswith("backend: got 'cpu', expected one of") for line in lines)
    assert "pydantic" not in r.content[0].text and "Error executing tool" not in r.content[0].text


def test_mcp_lists_and_objects_sent_as_json_text_are_still_accepted():
    r = _call({"card": "blk/1", "seeds": "3", "top": "12", "backend": "null"})
    assert not r.is_error, r.content
    assert r.structured_content["seeds"] == 3 and len(r.structured_content["items"]) == 12


def test_mcp_hints_name_tool_arguments():
    r = _call({"source": "k.cpp"})
    assert r.is_error
    assert r.content[0].text == ("ModuleLensError: source needs target and backend\n"
                                 "hint: e.g. source=k.cpp target=blk/6 backend=cpp")


def test_mcp_check_across_fields_names_arguments():
    r = _call({"card": "blk/0", "source": "k.cpp"})
    assert r.is_error and "give card or source, not both" in r.content[0].text


# --------------------------------------------------------------------------------------------
# The same in the CLI
# --------------------------------------------------------------------------------------------


def test_cli_hints_name_flags(cli):
    r = cli("build", "--source", "k.cpp")
    assert r.exit_code == 2
    assert "error: --source needs --target CARD and --backend" in r.stderr
    assert "hint: e.g. --source k.cpp --target blk/6 --backend cpp" in r.stderr


def test_cli_validation_names_flags_one_line_each(cli):
    r = cli("build", "--seeds", "11", "--top", "0")
    assert r.exit_code == 2
    lines = [line.removeprefix("error: ") for line in r.stderr.splitlines() if "invalid" in line]
    assert lines == ["invalid --seeds: got 11, expected less than or equal to 10",
                     "invalid --top: got 0, expected greater than or equal to 1"]
    r = cli("build", "--card", "blk/0", "--source", "k.cpp", "--json")
    assert r.exit_code == 2 and json.loads(r.stdout)["error"] == "give --card or --source FILE, not both"


def test_cli_refuses_a_misspelt_option_with_a_suggestion(cli):
    r = cli("build", "--sedes", "3")
    assert r.exit_code == 2 and "--sedes" in r.output and "--seeds" in r.output


def test_cli_top_is_an_option_and_the_output_keeps_its_shape(cli):
    r = cli("build", "--top", "5", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["items"] == [0, 1, 2, 3, 4]
    assert out["left_out"] == [{"field": "items", "shown": 5, "total": 12, "full": "modulelens://items"}]


# --------------------------------------------------------------------------------------------
# Compact listing, replies, long lists
# --------------------------------------------------------------------------------------------


def test_mcp_reply_text_is_the_structured_content_as_compact_json():
    r = _call({"card": "blk/2"})
    assert not r.is_error
    (block,) = r.content
    assert json.loads(block.text) == r.structured_content  # text-only clients see everything
    assert block.text == json.dumps(r.structured_content, separators=(",", ":"), ensure_ascii=False)
    assert r.structured_content["left_out"] == [{"field": "items", "shown": 3, "total": 12,
                                                 "full": "modulelens://items"}]
    assert r.structured_content["warnings"] == ["timing undetermined: pass seeds above 2"]  # markers as names
    assert r.structured_content["next"] == [{"tool": "build", "arguments": {"card": "blk/3", "top": 5,
                                                                           "backend": "cpp"}}]


def test_cli_shows_warnings_with_flags_and_next_calls_as_command_lines(cli):
    r = cli("build", "--card", "blk/2")
    assert r.exit_code == 0, r.output
    assert "warning: timing undetermined: pass --seeds N above 2" in r.stdout
    assert "next: modulelens build --card blk/3 --backend cpp --top 5" in r.stdout
    r = cli("build", "--card", "blk/2", "--json")
    assert json.loads(r.stdout)["warnings"] == ["timing undetermined: pass --seeds N above 2"]


def test_next_calls_become_command_lines_with_positional_arguments_in_order():
    from modulelens.cli.app import cli_command
    from modulelens.tools import all_tools

    tools = all_tools()
    assert cli_command(call("replay_module", ref="blk:v1", strategy="export"), tools) == (
        "modulelens replay-module blk:v1 --strategy export")
    assert cli_command(call("list", kind="cards", of="blk"), tools) == "modulelens list cards blk"
    assert cli_command(call("pack", candidates=["a.card1:v1", "b.module:v2"], out="x y.pack"), tools) == (
        "modulelens pack a.card1:v1 b.module:v2 --out 'x y.pack'")
    assert cli_command(call("run", script="t.py", pack="p", compare=True), tools) == (
        "modulelens run t.py --pack p --compare")
    assert cli_command(call("job_status", job="j1"), tools) == 'job_status {"job": "j1"}'  # MCP only


# --------------------------------------------------------------------------------------------
# Suggested calls in hints and warnings, per front end
# --------------------------------------------------------------------------------------------


def test_call_markers_read_as_tool_calls_over_mcp_and_command_lines_in_the_cli():
    from modulelens.cli.app import cli_text
    from modulelens.tools import all_tools

    text = (f"validate it with {tool_call('validate_kernel', candidate='blk.card6:v1', seeds=3)}, "
            f"then {tool_call('pack', candidates=['a:v1', 'b:v2'], out='m.pack')} or {tool_call('optimize')}; "
            f"or pass {arg('limit', 'N')}")
    assert render(text, "args") == ('validate it with validate_kernel {"candidate": "blk.card6:v1", "seeds": 3}, '
                                    'then pack {"candidates": ["a:v1", "b:v2"], "out": "m.pack"} or optimize; '
                                    'or pass limit')
    assert cli_text(text, all_tools()) == ("validate it with modulelens validate-kernel blk.card6:v1 --seeds 3, "
                                           "then modulelens pack a:v1 b:v2 --out m.pack or modulelens optimize; "
                                           "or pass --limit N")
    assert ModuleLensError("x", text).rendered("args")[1] == render(text, "args")  # raw text keeps the markers


def test_a_domain_error_names_the_mcp_tool_over_mcp_and_the_command_in_the_cli(tmp_path, cli):
    from modulelens.tools import all_tools

    async def body(c):
        return await c.call_tool("show", {"kind": "search", "ref": "nope"})

    async def main():
        async with Client(build_server(all_tools(), repo_root=tmp_path)) as client:
            return await body(client)

    r = anyio.run(main)
    assert r.is_error and r.content[0].text.endswith('hint: start one with optimize {"targets": ["blk/6"]}')
    app = build_app(all_tools(), rich_help=False)
    r = CliRunner().invoke(app, ["show", "search", "nope", "--repo", str(tmp_path)])
    assert r.exit_code == 2 and "hint: start one with modulelens optimize blk/6" in r.stderr, r.output


def test_warnings_with_calls_are_rendered_per_front_end():
    @tool
    def probe(req: BuildRequest, ctx: ToolContext) -> BuildResult:
        """Probe."""
        result = BuildResult(card="blk/0", seeds=1, items=[])
        result.warnings = [f"not trusted: trust it with {tool_call('trust', ref='p:v1', kind='packs', yes=True)}"]
        return result

    async def body(c):
        return await c.call_tool("probe", {})

    r = _mcp([probe], body)
    assert r.structured_content["warnings"] == ['not trusted: trust it with trust {"ref": "p:v1", "kind": "packs", '
                                                '"yes": true}']
    from modulelens.tools import all_tools

    app = build_app([probe, *all_tools()], rich_help=False)
    r = CliRunner().invoke(app, ["probe", "--json"])
    assert json.loads(r.stdout)["warnings"] == ["not trusted: trust it with modulelens trust p:v1 --kind packs --yes"]
    r = CliRunner().invoke(app, ["probe"])
    assert "warning: not trusted: trust it with modulelens trust p:v1 --kind packs --yes" in r.stdout


def test_every_real_tool_lists_within_budget_and_documents_its_result():
    from modulelens.tools import all_tools

    tools = all_tools()

    async def body(c):
        listed = await c.list_tools()
        schemas = {t.name: json.loads((await c.read_resource(f"modulelens://schemas/{t.name}")).contents[0].text)
                   for t in tools if t.mcp}
        for schema in schemas.values():  # models that did not fit the page have pages of their own
            for cut in schema.pop("left_out", []):
                page = json.loads((await c.read_resource(cut["full"])).contents[0].text)
                schema.setdefault("$defs", {})[cut["field"].removeprefix("$defs.")] = page
        return listed, schemas

    listed, schemas = _mcp(tools, body)
    assert len(listed.model_dump_json(by_alias=True, exclude_none=True)) <= MAX_TOOLS_LIST_CHARS
    assert len(listed.tools) <= MAX_TOOLS
    assert {t.name for t in listed.tools} == {t.name for t in tools if t.mcp} | {"start_job", "job_status"}
    for listed_tool in listed.tools:
        assert "Arguments:" not in listed_tool.description and "[--" not in listed_tool.description
        props = listed_tool.input_schema["properties"]
        assert "title" not in props.get(next(iter(props), ""), {})
        assert "[--" not in json.dumps(listed_tool.input_schema)  # argument markers are written as names
    for t in tools:
        if not t.mcp:
            continue
        schema = schemas[t.name]
        models = t.result_models
        if len(models) == 1:
            assert set(schema["properties"]) == set(models[0].model_fields)
        else:  # a union: one $defs entry per model, each documented in full
            assert len(schema["anyOf"]) == len(models)
            for model in models:
                assert set(schema["$defs"][model.__name__]["properties"]) == set(model.model_fields)


def test_every_real_tool_result_carries_warnings_and_next_and_every_cut_has_a_maximum():
    from modulelens.listing import MAX_ITEMS
    from modulelens.tools import all_tools

    for t in all_tools():
        for model in t.result_models:
            assert issubclass(model, ToolReply), (t.name, model)
            assert list(model.model_fields)[:2] == ["warnings", "next"], (t.name, model)  # read first
        for name in ("top", "limit"):
            field = t.request.model_fields.get(name)
            if field is not None:
                maxima = [c.le for c in field.metadata if hasattr(c, "le")]
                assert maxima and maxima[0] <= MAX_ITEMS, (t.name, name)


def test_a_huge_limit_is_refused_in_one_line_naming_the_maximum(tmp_path):
    from modulelens.tools import all_tools

    async def body(c):
        return await c.call_tool("list", {"kind": "captures", "limit": 10**6})

    async def main():
        async with Client(build_server(all_tools(), repo_root=tmp_path)) as client:
            return await body(client)

    r = anyio.run(main)
    assert r.is_error
    assert r.content[0].text == "invalid arguments:\nlimit: got 1000000, expected less than or equal to 100"


def test_list_and_show_check_their_kind_one_spelling_with_the_singular_as_alias(tmp_path):
    from modulelens.tools import all_tools

    async def main():
        async with Client(build_server(all_tools(), repo_root=tmp_path)) as c:
            listed = await c.list_tools()
            return listed, [await c.call_tool("list", {"kind": "captures"}),
                            await c.call_tool("list", {"kind": "capture"}),
                            await c.call_tool("list", {"kind": "cards"}),
                            await c.call_tool("show", {"kind": "card", "ref": "blk/0", "tensors": True}),
                            await c.call_tool("list", {"kind": "searches", "of_": "x"}),
                            await c.call_tool("show", {"kind": "pack", "ref": "nothing"}),
                            await c.call_tool("list", {"kind": "capturez"})]

    listed, (empty, singular, cards, tensors, misspelt, missing, wrong) = anyio.run(main)
    kinds = {t.name: t.input_schema["properties"]["kind"]["enum"] for t in listed.tools
             if t.name in ("list", "show", "push", "trust")}
    assert set(kinds) == {"list", "show", "push", "trust"}
    assert all(k.endswith("s") for enum in kinds.values() for k in enum), kinds  # one spelling: plural
    assert not empty.is_error and empty.structured_content["captures"] == []
    assert empty.structured_content["warnings"] == [f"no captures in {tmp_path}: is this the repository you meant?"]
    assert not singular.is_error and singular.structured_content == empty.structured_content  # an alias
    assert cards.is_error and "kind cards needs the opset" in cards.content[0].text
    assert tensors.is_error and "tensors goes with kind captures, not cards" in tensors.content[0].text
    assert wrong.is_error and "(did you mean 'captures'?)" in wrong.content[0].text
    assert misspelt.is_error and "did you mean of?" in misspelt.content[0].text
    assert missing.is_error and "nothing" in missing.content[0].text


# --------------------------------------------------------------------------------------------
# Tools declared once
# --------------------------------------------------------------------------------------------


class PingRequest(BaseModel):
    n: int = 1


class PingResult(ToolReply):
    n: int


def test_the_decorator_takes_name_summary_and_models_from_the_function():
    @tool
    def list_(req: PingRequest, ctx: ToolContext) -> PingResult:
        """Ping back, n times.

        The rest of the docstring is for people reading the code."""
        return PingResult(n=req.n)

    assert (list_.name, list_.summary, list_.request, list_.result) == ("list", "Ping back, n times.", PingRequest,
                                                                         PingResult)
    assert list_.mcp and list_(PingRequest(n=3)).n == 3


class Plain(BaseModel):
    n: int


def test_the_decorator_refuses_what_cannot_be_a_tool():
    def undocumented(req: PingRequest, ctx: ToolContext) -> PingResult:
        return PingResult(n=1)

    def no_reply(req: PingRequest, ctx: ToolContext) -> Plain:
        """Has no warnings."""
        return Plain(n=1)

    def untyped(req, ctx):
        """No annotations."""

    for fn, words in ((undocumented, "docstring"), (no_reply, "ToolReply"), (untyped, "typed")):
        with pytest.raises(TypeError, match=words):
            tool(fn)


def test_the_registry_holds_each_name_once_and_names_the_known_ones():
    with pytest.raises(ValueError, match="given twice"):
        ToolRegistry([BUILD, BUILD])
    with pytest.raises(ModuleLensError) as e:
        ToolRegistry([BUILD]).get("biuld")
    assert e.value.hint == "tools: build"


def test_compact_schema_keeps_meaning():
    schema = {"title": "X", "type": "object", "properties": {
        "title": {"title": "Title", "type": "string"},
        "device": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None, "title": "Device"},
        "top": {"anyOf": [{"minimum": 1, "type": "integer"}, {"type": "null"}], "default": 10},
        "repeats": {"minimum": 3, "type": "integer", "exclusiveMinimum": 0, "maximum": 9},
        "mode": {"enum": ["a", "b"], "type": "string", "default": "a"},
    }}
    assert compact_schema(schema) == {"type": "object", "properties": {
        "title": {"type": "string"},
        "device": {"type": "string"},
        "top": {"type": ["integer", "null"], "default": 10},  # counts start at 1: said once
        "repeats": {"minimum": 3, "type": "integer", "maximum": 9},
        "mode": {"enum": ["a", "b"], "default": "a"},
    }}


def test_everything_lifts_every_cut_to_its_maximum():
    assert everything(BuildRequest) == {"top": 100}

    class Fixed(BaseModel):
        limit: int = 10  # no maximum: left alone
        full: bool = False

    assert everything(Fixed) == {"full": True}


def test_keep_first_and_thin_steps():
    view = StatsRunView(
        entry=StatsRunEntry.model_construct(), steps=list(range(0, 100, 10)), path="/runs/r/v1",
        modules=[ModuleSeries(name=f"m{i}", index=i, activation={"std": [float(s) for s in range(10)]})
                 for i in range(5)],
    )
    cut = thin_steps(keep_first(view, "modules", 2, "/runs/r/v1/series.json"), 4)
    assert [m.name for m in cut.modules] == ["m0", "m1"]
    assert cut.steps == [0, 30, 60, 90] and cut.modules[0].activation["std"] == [0.0, 3.0, 6.0, 9.0]
    assert [(c.field, c.shown, c.total) for c in cut.left_out] == [("modules", 2, 5), ("steps", 4, 10)]
    assert keep_first(view, "modules", None, "x") is view and thin_steps(view, None) is view
