"""The Claude Code plugin and its marketplace entry (.claude-plugin/): both parse, point at files
that exist, carry the package's version, and ship the skills and MCP server that install-skills
writes into a project, so `/plugin marketplace add` then `/plugin install modulelens@modulelens`
gives the same skills and server as the .claude/ wiring."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from conftest import ROOT

import modulelens
from modulelens.tools.install_skills import MCP_SERVER_ENTRY, MCP_SERVER_NAME, available_skills

MARKETPLACE = ROOT / ".claude-plugin" / "marketplace.json"


def _json(path: Path) -> dict:
    data = json.loads(path.read_text(encoding="utf-8"))
    assert isinstance(data, dict), f"{path} does not hold a JSON object"
    return data


def _relative(root: Path, value: str) -> Path:
    """A component path of the plugin: relative, starting with ./, inside the plugin root."""
    assert value.startswith("./"), f"plugin paths start with ./ (got {value!r})"
    path = (root / value).resolve()
    assert path.is_relative_to(root.resolve()), f"{value!r} leaves the plugin"
    return path


@pytest.fixture(scope="module")
def marketplace() -> dict:
    return _json(MARKETPLACE)


@pytest.fixture(scope="module")
def plugin_root(marketplace) -> Path:
    (entry,) = marketplace["plugins"]
    # relative plugin sources resolve from the marketplace root: the folder holding .claude-plugin/
    return _relative(MARKETPLACE.parent.parent, entry["source"])


@pytest.fixture(scope="module")
def plugin(plugin_root) -> dict:
    return _json(plugin_root / ".claude-plugin" / "plugin.json")


def test_marketplace_lists_the_plugin(marketplace, plugin):
    assert marketplace["name"] == "modulelens" and marketplace["owner"]["name"]
    (entry,) = marketplace["plugins"]
    assert entry["name"] == plugin["name"] == "modulelens"  # /plugin install modulelens@modulelens
    assert entry["description"]


def test_plugin_version_is_the_packages(plugin):
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert plugin["version"] == pyproject["project"]["version"] == modulelens.__version__
    assert plugin["description"]


def test_plugin_skills_are_the_ones_install_skills_installs(plugin, plugin_root):
    skills = _relative(plugin_root, plugin["skills"])
    shipped = {p.parent.name for p in skills.glob("*/SKILL.md")}
    assert shipped == set(available_skills())
    for name in shipped:
        assert (skills / name / "SKILL.md").read_text(encoding="utf-8") == \
            available_skills()[name].read_text(encoding="utf-8")


def test_plugin_starts_the_mcp_server_as_the_cli_does(app, plugin, plugin_root):
    config = _json(_relative(plugin_root, plugin["mcpServers"]))
    entry = config["mcpServers"][MCP_SERVER_NAME]
    assert {k: entry[k] for k in MCP_SERVER_ENTRY} == MCP_SERVER_ENTRY  # `modulelens mcp`, as install-skills writes
    assert entry["command"] == "modulelens" and entry["args"][0] in app.commands
