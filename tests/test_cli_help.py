"""Every command's --help ends with an example that really parses into its request model; help
is plain text (no boxes) off a terminal; every tool's result has a view."""

from __future__ import annotations

import dataclasses
import re
import shlex

import pytest
from pydantic import BaseModel
from click.testing import CliRunner

from modulelens.cli.app import build_app
from modulelens.cli.examples import EXAMPLES, example_line
from modulelens.cli.views import view_for
from modulelens.errors import ModuleLensError
from modulelens.registry import Tool
from modulelens.tools import all_tools

TOOLS = {t.name: t for t in all_tools()}
COMMON_OPTIONS = {"--repo", "--json", "--quiet", "-q", "--wide"}


def test_every_tool_has_an_example_and_every_example_a_tool():
    assert set(EXAMPLES) == set(TOOLS)


def _options(args: list[str]) -> list[str]:
    """The option names an example uses (up to a bare ``--``; ``--x=1`` counts as ``--x``)."""
    head = args[: args.index("--")] if "--" in args else args
    return [a.split("=", 1)[0] for a in head if a.startswith("-")]


def _request_option_names(request: type[BaseModel]) -> set[str]:
    dashed = [name.replace("_", "-") for name in request.model_fields]
    return {f"--{d}" for d in dashed} | {f"--no-{d}" for d in dashed}


@pytest.mark.parametrize("name", sorted(TOOLS))
def test_example_parses_into_the_request_model(name):
    tool = TOOLS[name]
    args = shlex.split(EXAMPLES[name])
    assert set(_options(args)) <= _request_option_names(tool.request) | COMMON_OPTIONS, name
    seen: list[BaseModel] = []

    def record(request: BaseModel, ctx) -> BaseModel:
        seen.append(request)
        raise ModuleLensError("parsed")  # nothing runs: only the parsing is under test

    app = build_app([dataclasses.replace(tool, fn=record)])
    r = CliRunner().invoke(app, [tool.cli_name, *args])
    assert r.exit_code == 2 and r.stderr == "error: parsed\n", (name, r.output)
    assert len(seen) == 1 and isinstance(seen[0], tool.request)
    given = {k for k, v in seen[0].model_dump().items() if v != tool.request.model_fields[k].get_default(
        call_default_factory=True, validated_data={})}
    assert given, f"{name}: the example sets nothing"


@pytest.fixture
def plain_app(monkeypatch):
    """The application as built when stdout is not a terminal (the default decides by stdout)."""
    import io
    import sys

    for name in ("FORCE_COLOR", "TTY_COMPATIBLE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    return build_app(all_tools())


@pytest.mark.parametrize("rich_help", [False, True])
def test_help_ends_with_the_example(plain_app, rich_help):
    runner = CliRunner()
    app = plain_app if not rich_help else build_app(all_tools(), rich_help=True)
    for tool in TOOLS.values():
        r = runner.invoke(app, [tool.cli_name, "--help"], env={"COLUMNS": "200"})
        assert r.exit_code == 0, r.output
        text = re.sub(r"\x1b\[[0-9;]*m", "", r.stdout)
        assert "Example:" in text
        assert example_line(tool.name, tool.cli_name) in " ".join(text.split()), (tool.name, text)


def test_help_off_a_terminal_is_plain(plain_app):
    app, runner = plain_app, CliRunner()
    for args in (["--help"], ["capture-ops", "--help"]):
        r = runner.invoke(app, args)
        assert r.exit_code == 0 and not re.search("[─│╭╮╰╯]", r.stdout), r.stdout
    r = runner.invoke(app, ["capture-ops", "--help"])
    for option in ("--json", "--quiet", "--wide", "--repo", "--max-tensor-bytes"):
        assert option in r.stdout


def test_every_tool_result_has_a_view():
    missing = [(t.name, m.__name__) for t in all_tools() for m in t.result_models if view_for(m) is None]
    assert not missing


def test_a_tool_without_a_view_uses_its_own_render_then_the_generic_one():
    class Q(BaseModel):
        pass

    class R(BaseModel):
        rows: list[dict[str, int]]
        n: int

    plain = Tool("plain", Q, R, lambda req, ctx: R(rows=[{"a": 1, "b": 2}], n=3), "P.")
    custom = dataclasses.replace(plain, name="custom", render=lambda r: f"n is {r.n}")
    runner = CliRunner()
    r = runner.invoke(build_app([plain, custom]), ["plain"])
    assert r.exit_code == 0 and re.search(r"^n\s+3$", r.stdout, re.M) and re.search(r"^a\s+b$", r.stdout, re.M)
    r = runner.invoke(build_app([plain, custom]), ["custom"])
    assert r.stdout == "n is 3\n"
