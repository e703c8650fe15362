"""The CLI and the MCP server, generated from fake tools (no torch, no repository)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import anyio
import pytest
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel, Field
from click.testing import CliRunner

from modulelens.cli.app import build_app
from modulelens.errors import ModuleLensError, ReferenceNotFound
from modulelens.mcp_server.server import build_server
from modulelens.registry import Tool, ToolContext

# --------------------------------------------------------------------------------------------
# Fake tools
# --------------------------------------------------------------------------------------------


class EchoRequest(BaseModel):
    script: str = Field(
        description="The text to echo.", json_schema_extra={"cli": "argument"}
    )
    count: int = Field(1, ge=1, description="How many times.")
    mode: Literal["same", "upper", "lower"] = Field("same", description="Case mode.")
    shout: bool = Field(False, description="Add an exclamation mark.")
    max_tensor_bytes: int | None = Field(None, description="A size limit.")
    module: list[str] = Field(
        default_factory=list, description="Module names (repeatable)."
    )
    out: Path | None = Field(None, description="A path.")
    script_args: list[str] = Field(
        default_factory=list,
        description="Arguments for the script.",
        json_schema_extra={"cli": "argument"},
    )


class EchoResult(BaseModel):
    text: str
    count: int
    mode: str
    shout: bool
    max_tensor_bytes: int | None
    module: list[str]
    out: str | None
    script_args: list[str]
    repo_root: str
    stdout_is_protocol: bool


def _echo(req: EchoRequest, ctx: ToolContext) -> EchoResult:
    text = {
        "same": req.script,
        "upper": req.script.upper(),
        "lower": req.script.lower(),
    }[req.mode]
    if req.shout:
        text += "!"
    return EchoResult(
        text=" ".join([text] * req.count),
        count=req.count,
        mode=req.mode,
        shout=req.shout,
        max_tensor_bytes=req.max_tensor_bytes,
        module=req.module,
        out=None if req.out is None else str(req.out),
        script_args=req.script_args,
        repo_root=str(ctx.repo_root),
        stdout_is_protocol=ctx.stdout_is_protocol,
    )


class FailRequest(BaseModel):
    ref: str = Field("x", description="A reference.")


class Empty(BaseModel):
    pass


def _fail(req: FailRequest, ctx: ToolContext) -> Empty:
    raise ReferenceNotFound(
        f"no capture {req.ref!r}", hint="run `modulelens list captures`"
    )


class StepsRequest(BaseModel):
    steps: int = Field(3, description="Number of steps.")


class StepsResult(BaseModel):
    steps: int


def _with_progress(req: StepsRequest, ctx: ToolContext) -> StepsResult:
    for i in range(1, req.steps + 1):
        ctx.progress(i, req.steps, f"step {i}")
    return StepsResult(steps=req.steps)


class CaptureRow(BaseModel):
    name: str
    version: int


class ListRequest(BaseModel):
    kind: Literal["captures", "stats"] = Field(json_schema_extra={"cli": "argument"})
    limit: int = Field(10, le=100, description="At most this many.")


class ListCapturesResult(BaseModel):
    captures: list[CaptureRow]


class ShowRequest(BaseModel):
    kind: Literal["capture", "stats"] = Field(json_schema_extra={"cli": "argument"})
    ref: str = Field(
        description="name, name:vN or name@tag", json_schema_extra={"cli": "argument"}
    )


class ShowCaptureResult(BaseModel):
    ref: str
    tensors: dict[str, list[int]]


def _list(req: ListRequest, ctx: ToolContext) -> ListCapturesResult:
    return ListCapturesResult(
        captures=[CaptureRow(name="enc0", version=2), CaptureRow(name="a", version=1)]
    )


def _show(req: ShowRequest, ctx: ToolContext) -> ShowCaptureResult:
    if req.ref.startswith("missing"):
        raise ReferenceNotFound(
            f"no capture {req.ref!r}", hint="run `modulelens list captures`"
        )
    return ShowCaptureResult(ref=req.ref, tensors={"input.0": [2, 3]})


ECHO = Tool("echo", EchoRequest, EchoResult, _echo, "Echo the text back.")
FAIL = Tool("fail_always", FailRequest, Empty, _fail, "Always fails.")
STEPS = Tool(
    "with_progress", StepsRequest, StepsResult, _with_progress, "Reports progress."
)
LIST = Tool("list", ListRequest, ListCapturesResult, _list, "List captures.")
SHOW = Tool("show", ShowRequest, ShowCaptureResult, _show, "Show one capture.")
TOOLS = [ECHO, FAIL, STEPS, LIST, SHOW]


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("MODULELENS_HOME", str(tmp_path / "home"))
    app = build_app(TOOLS)
    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(app, list(args))

    return invoke


def test_cli_json_output_is_exactly_the_result(cli, tmp_path: Path):
    repo = tmp_path / "repo"
    r = cli(
        "echo", "hi", "--count", "2", "--mode", "upper", "--shout", "--max-tensor-bytes", "10",
        "--module", "blocks.1", "--module", "blocks.2", "--out", "o.pt", "--repo", str(repo), "--json",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    expected = _echo(
        EchoRequest(script="hi", count=2, mode="upper", shout=True, max_tensor_bytes=10,
                    module=["blocks.1", "blocks.2"], out=Path("o.pt")),
        ToolContext(repo_root=repo),
    )  # fmt: skip
    assert r.stdout == expected.model_dump_json(indent=2) + "\n"
    assert EchoResult.model_validate_json(r.stdout) == expected
    assert r.stderr == ""


def test_cli_defaults_come_from_the_model(cli, tmp_path: Path):
    r = cli("echo", "hi", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["count"] == 1 and out["mode"] == "same" and out["shout"] is False
    assert (
        out["module"] == []
        and out["script_args"] == []
        and out["max_tensor_bytes"] is None
    )
    assert out["repo_root"] == str(tmp_path / "home")  # $MODULELENS_HOME
    assert out["stdout_is_protocol"] is False


def test_cli_double_dash_fills_the_variadic_argument(cli):
    r = cli("echo", "train.py", "--module", "blocks.1", "--json", "--", "--steps", "3")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["text"] == "train.py"
    assert out["module"] == ["blocks.1"]
    assert out["script_args"] == ["--steps", "3"]


def test_cli_flag_off_and_help(cli):
    r = cli("echo", "hi", "--no-shout", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["shout"] is False
    r = cli("echo", "--help")
    assert r.exit_code == 0
    for text in (
        "--max-tensor-bytes",
        "--shout",
        "--no-shout",
        "--repo",
        "--json",
        "script",
        "Echo the text back",
    ):
        assert text in r.stdout
    r = cli("--help")
    assert r.exit_code == 0
    for name in (
        "echo",
        "fail-always",
        "with-progress",
        "list",
        "show",
        "mcp",
        "version",
    ):
        assert name in r.stdout


def test_cli_literal_is_a_choice(cli):
    r = cli("echo", "hi", "--mode", "loud")
    assert r.exit_code == 2
    assert "loud" in r.stderr


def test_cli_human_output(cli):
    r = cli("echo", "hi", "--count", "2")
    assert r.exit_code == 0, r.output
    assert "hi hi" in r.stdout and "count" in r.stdout
    r = cli("list", "captures")
    assert r.exit_code == 0, r.output
    assert "enc0" in r.stdout and "version" in r.stdout


def test_cli_custom_render():
    tool = Tool(
        "steps",
        StepsRequest,
        StepsResult,
        _with_progress,
        "S.",
        render=lambda res: f"did {res.steps} steps",
    )
    r = CliRunner().invoke(build_app([tool]), ["steps", "--steps", "4"])
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() == "did 4 steps"


def test_cli_tool_error_exits_2_with_hint(cli):
    r = cli("fail-always", "--ref", "enc9")
    assert r.exit_code == 2
    assert r.stdout == ""
    assert "error: no capture 'enc9'" in r.stderr
    assert "hint: run `modulelens list captures`" in r.stderr

    r = cli("fail-always", "--ref", "enc9", "--json")
    assert r.exit_code == 2
    assert json.loads(r.stdout) == {
        "error": "no capture 'enc9'",
        "hint": "run `modulelens list captures`",
        "type": "ReferenceNotFound",
    }


def test_cli_validation_error_names_the_option(cli):
    r = cli("echo", "hi", "--count", "0")
    assert r.exit_code == 2
    assert "error:" in r.stderr and "--count" in r.stderr
    r = cli("echo", "hi", "--count", "0", "--json")
    assert r.exit_code == 2
    out = json.loads(r.stdout)
    assert out["type"] == "ValidationError" and "--count" in out["error"]


def test_cli_progress_tool_runs_without_a_terminal(cli):
    r = cli("with-progress", "--steps", "5", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == {"steps": 5}
    assert r.stderr == ""


def test_cli_version(cli):
    r = cli("version")
    assert r.exit_code == 0 and r.stdout.strip()


def test_cli_rejects_clashing_field_names():
    class Bad(BaseModel):
        repo: str = "x"

    with pytest.raises(ValueError, match="repo"):
        build_app([Tool("bad", Bad, Empty, lambda r, c: Empty(), "Bad.")])


# --------------------------------------------------------------------------------------------
# MCP
# --------------------------------------------------------------------------------------------


def _mcp(tools: list[Tool], body, repo_root: Path | None = None) -> Any:
    from mcp import Client

    server = build_server(tools, repo_root=repo_root)

    async def main():
        async with Client(server) as client:
            return await body(client)

    return anyio.run(main)


def test_mcp_lists_flat_input_and_result_output_schemas():
    async def body(c):
        schema = json.loads((await c.read_resource("modulelens://schemas/echo")).contents[0].text)
        return {t.name: t for t in (await c.list_tools()).tools}, schema

    tools, echo_result_schema = _mcp(TOOLS, body)
    assert set(tools) == {
        "echo",
        "fail_always",
        "with_progress",
        "list",
        "show",
    }
    echo = tools["echo"]
    props = echo.input_schema["properties"]
    assert set(props) == set(EchoRequest.model_fields)
    assert echo.input_schema.get("required") == ["script"]
    assert props["count"]["description"] == "How many times."
    assert props["count"]["default"] == 1 and "minimum" not in props["count"]  # said once; still checked
    assert "cli" not in json.dumps(echo.input_schema)
    # tools/list stays small: the result's fields are described by the schema resource, the
    # arguments only by the input schema (not again in the description).
    assert echo.output_schema is None
    assert set(echo_result_schema["properties"]) == set(EchoResult.model_fields)
    assert echo.description == "Echo the text back." and "max_tensor_bytes" in props


def test_mcp_call_returns_structured_content(tmp_path: Path):
    async def body(c):
        return await c.call_tool(
            "echo",
            {
                "script": "hi",
                "count": 2,
                "mode": "upper",
                "script_args": ["--steps", "3"],
            },
        )

    res = _mcp(TOOLS, body, repo_root=tmp_path)
    assert not res.is_error
    expected = _echo(
        EchoRequest(script="hi", count=2, mode="upper", script_args=["--steps", "3"]),
        ToolContext(repo_root=tmp_path, stdout_is_protocol=True),
    )
    assert res.structured_content == expected.model_dump(mode="json")
    assert res.structured_content["stdout_is_protocol"] is True


def test_mcp_tool_error_carries_message_and_hint():
    async def body(c):
        return await c.call_tool("fail_always", {"ref": "enc9"})

    res = _mcp(TOOLS, body)
    assert res.is_error
    text = res.content[0].text
    assert (
        "no capture 'enc9'" in text and "hint: run `modulelens list captures`" in text
    )


def test_mcp_validation_error_is_a_tool_error():
    async def body(c):
        return await c.call_tool("echo", {"script": "hi", "count": 0})

    res = _mcp(TOOLS, body)
    assert res.is_error and "count" in res.content[0].text


def test_mcp_forwards_progress():
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(
        progress: float, total: float | None, message: str | None
    ) -> None:
        seen.append((progress, total, message))

    async def body(c):
        return await c.call_tool(
            "with_progress", {"steps": 3}, progress_callback=on_progress
        )

    res = _mcp(TOOLS, body)
    assert not res.is_error and res.structured_content == {"steps": 3}
    assert seen == [(1.0, 3.0, "step 1"), (2.0, 3.0, "step 2"), (3.0, 3.0, "step 3")]


def test_mcp_capture_resources():
    refs = ["enc0", "enc0:v2", "enc0@prod", "a:v2", "enc0%3Av2"]

    async def body(c):
        listed = [str(r.uri) for r in (await c.list_resources()).resources]
        templates = [
            t.uri_template
            for t in (await c.list_resource_templates()).resource_templates
        ]
        all_ = json.loads(
            (await c.read_resource("modulelens://captures")).contents[0].text
        )
        shown = {}
        for ref in refs:
            shown[ref] = json.loads(
                (await c.read_resource(f"modulelens://captures/{ref}")).contents[0].text
            )
        with pytest.raises(MCPError) as missing:  # a protocol error: resource not found
            await c.read_resource("modulelens://captures/missing:v1")
        return listed, templates, all_, shown, missing

    listed, templates, all_, shown, missing = _mcp(TOOLS, body)
    assert listed == ["modulelens://captures", "modulelens://stats"]
    assert templates == ["modulelens://schemas/{tool}", "modulelens://captures/{ref}", "modulelens://stats/{ref}"]
    assert all_ == {
        "captures": [{"name": "enc0", "version": 2}, {"name": "a", "version": 1}]
    }
    assert shown["enc0:v2"]["ref"] == "enc0:v2"
    assert shown["enc0@prod"]["ref"] == "enc0@prod"
    assert shown["a:v2"]["ref"] == "a:v2"
    assert shown["enc0%3Av2"]["ref"] == "enc0:v2"  # percent-encoded refs are decoded
    assert "missing:v1" in str(missing.value) and "hint:" in str(missing.value)


def test_mcp_no_resources_without_capture_tools():
    async def body(c):
        return (await c.list_resources()).resources, (
            await c.list_resource_templates()
        ).resource_templates

    resources, templates = _mcp([ECHO], body)
    assert resources == [] and [t.uri_template for t in templates] == ["modulelens://schemas/{tool}"]


def test_mcp_tool_error_type_is_not_lost():
    def boom(req: FailRequest, ctx: ToolContext) -> Empty:
        raise ModuleLensError("plain failure")

    async def body(c):
        return await c.call_tool("boom", {})

    res = _mcp([Tool("boom", FailRequest, Empty, boom, "Boom.")], body)
    assert (
        res.is_error
        and "plain failure" in res.content[0].text
        and "hint" not in res.content[0].text
    )


def _printing(req: StepsRequest, ctx: ToolContext) -> StepsResult:
    print("stray output from user code")  # must not corrupt the stdio wire
    for i in range(1, req.steps + 1):
        ctx.progress(i, req.steps, f"step {i}")
    return StepsResult(steps=req.steps)


PRINTING = Tool("printing", StepsRequest, StepsResult, _printing, "Prints to stdout.")


def test_mcp_over_real_stdio_keeps_stdout_clean(tmp_path: Path):
    """A subprocess server on stdio: a tool that prints does not break the protocol, and
    progress arrives as JSON-RPC notifications."""
    import os
    import sys

    from mcp import Client, StdioServerParameters

    here = Path(__file__).resolve().parent
    code = (
        "import sys; sys.path[:0] = [sys.argv[1], sys.argv[2]]\n"
        "from test_frontends import TOOLS, PRINTING\n"
        "from modulelens.mcp_server.server import build_server\n"
        "build_server(TOOLS + [PRINTING]).run('stdio')\n"
    )
    params = StdioServerParameters(
        command=sys.executable,
        args=["-c", code, str(here), str(here.parent)],
        env={**os.environ, "MODULELENS_HOME": str(tmp_path)},
        cwd=str(tmp_path),
    )
    seen: list[float] = []

    async def on_progress(
        progress: float, total: float | None, message: str | None
    ) -> None:
        seen.append(progress)

    async def main():
        async with Client(params) as c:
            res = await c.call_tool(
                "printing", {"steps": 2}, progress_callback=on_progress
            )
            echo = await c.call_tool("echo", {"script": "hi"})
            return res, echo

    res, echo = anyio.run(main)
    assert not res.is_error and res.structured_content == {"steps": 2}
    assert seen == [1.0, 2.0]
    assert echo.structured_content["repo_root"] == str(tmp_path)
    assert echo.structured_content["stdout_is_protocol"] is True
